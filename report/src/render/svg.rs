//! A minimal SVG writer: enough for charts, with every text and attribute value escaped.

use std::fmt::Write;

/// Escapes `text` for XML character data and attribute values; control characters XML 1.0
/// does not allow become U+FFFD.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A number for a coordinate: one decimal, no trailing `.0`.
pub fn num(value: f64) -> String {
    let rounded = (value * 10.0).round() / 10.0;
    if rounded == rounded.trunc() {
        format!("{}", rounded as i64)
    } else {
        format!("{rounded:.1}")
    }
}

/// An SVG document being written.
pub struct Svg {
    out: String,
}

impl Svg {
    /// Starts a document of `width` × `height` pixels with a `<title>` and a white background.
    pub fn new(width: f64, height: f64, title: &str) -> Svg {
        let mut out = String::new();
        out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n");
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"Verdana, sans-serif\" font-size=\"12\">",
            w = num(width),
            h = num(height)
        );
        let _ = writeln!(out, "<title>{}</title>", escape(title));
        let _ = writeln!(
            out,
            "<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>",
            num(width),
            num(height)
        );
        Svg { out }
    }

    /// An empty element: `<name a="v" .../>`; values are escaped here.
    pub fn element(&mut self, name: &str, attrs: &[(&str, &str)]) {
        self.out.push('<');
        self.out.push_str(name);
        self.attrs(attrs);
        self.out.push_str("/>\n");
    }

    /// An element with text content, escaped here.
    pub fn text_element(&mut self, name: &str, attrs: &[(&str, &str)], text: &str) {
        self.out.push('<');
        self.out.push_str(name);
        self.attrs(attrs);
        self.out.push('>');
        self.out.push_str(&escape(text));
        self.out.push_str("</");
        self.out.push_str(name);
        self.out.push_str(">\n");
    }

    /// `<text>` at (x, y).
    pub fn text(&mut self, x: f64, y: f64, attrs: &[(&str, &str)], text: &str) {
        let (x, y) = (num(x), num(y));
        let mut all: Vec<(&str, &str)> = vec![("x", &x), ("y", &y)];
        all.extend_from_slice(attrs);
        self.text_element("text", &all, text);
    }

    /// A straight line.
    pub fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), attrs: &[(&str, &str)]) {
        let coords = [num(x1), num(y1), num(x2), num(y2)];
        let mut all: Vec<(&str, &str)> = vec![
            ("x1", &coords[0]),
            ("y1", &coords[1]),
            ("x2", &coords[2]),
            ("y2", &coords[3]),
        ];
        all.extend_from_slice(attrs);
        self.element("line", &all);
    }

    /// Opens a group; close it with [`Svg::close`].
    pub fn open(&mut self, name: &str, attrs: &[(&str, &str)]) {
        self.out.push('<');
        self.out.push_str(name);
        self.attrs(attrs);
        self.out.push_str(">\n");
    }

    pub fn close(&mut self, name: &str) {
        let _ = writeln!(self.out, "</{name}>");
    }

    /// Ends the document.
    pub fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }

    fn attrs(&mut self, attrs: &[(&str, &str)]) {
        for (key, value) in attrs {
            let _ = write!(self.out, " {key}=\"{}\"", escape(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_escapes_text_and_attributes() {
        assert_eq!(
            escape("a<b> & \"c\" 'd'\u{1}"),
            "a&lt;b&gt; &amp; &quot;c&quot; &apos;d&apos;\u{fffd}"
        );
        let mut svg = Svg::new(10.0, 5.5, "t<&>");
        svg.text(1.0, 2.25, &[("fill", "a\"b")], "x < y");
        let doc = svg.finish();
        assert!(doc.contains("<title>t&lt;&amp;&gt;</title>"), "{doc}");
        assert!(
            doc.contains("<text x=\"1\" y=\"2.3\" fill=\"a&quot;b\">x &lt; y</text>"),
            "{doc}"
        );
        assert!(doc.ends_with("</svg>\n"));
        assert_eq!(num(-0.04), "0");
        assert_eq!(num(12.0), "12");
    }
}
