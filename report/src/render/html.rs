//! The self-contained HTML page of `vramshim html`: the views' JSON documents embedded as
//! data, drawn in the browser by a small hand-written script (no network, no framework).

use serde_json::Value;

/// The page's style sheet.
const STYLE: &str = include_str!("html/report.css");
/// The script that draws the page from its data.
const SCRIPT: &str = include_str!("html/report.js");

/// The whole page for `document` (an object of views: `summary`, `timeline`, `allocator`,
/// `oom`, `peak`, `leaks`, `whatif`, plus `logs`, `version`, `warnings`).
pub fn page(document: &Value) -> String {
    let data = embedded_json(document);
    let title = document["logs"]
        .as_array()
        .and_then(|logs| logs.first())
        .and_then(Value::as_str)
        .map_or_else(
            || "vramshim report".to_string(),
            |log| format!("vramshim: {log}"),
        );
    let mut page = String::with_capacity(data.len() + STYLE.len() + SCRIPT.len() + 512);
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    page.push_str("<title>");
    page.push_str(&escape_text(&title));
    page.push_str("</title>\n<style>\n");
    page.push_str(STYLE);
    page.push_str("</style>\n</head>\n<body>\n<main id=\"report\"><p id=\"loading\">Drawing the report (needs JavaScript)…</p></main>\n");
    page.push_str("<script type=\"application/json\" id=\"vramshim-data\">");
    page.push_str(&data);
    page.push_str("</script>\n<script>\n");
    page.push_str(SCRIPT);
    page.push_str("</script>\n</body>\n</html>\n");
    page
}

/// `document` as compact JSON that cannot end its `<script>` element: `<` only occurs inside
/// JSON strings, where `\u003c` means the same.
fn embedded_json(document: &Value) -> String {
    document.to_string().replace('<', "\\u003c")
}

/// `text` safe inside an HTML element.
fn escape_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn data_cannot_close_its_script_element() {
        let document = json!({"logs": ["</script><b>.vlog"], "x": "<!--"});
        let page = super::page(&document);
        let start = page.find("id=\"vramshim-data\">").unwrap();
        let data_end = start + page[start..].find("</script>").unwrap();
        let data = &page[start + "id=\"vramshim-data\">".len()..data_end];
        let parsed: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(parsed, document);
        assert!(page.contains("<title>vramshim: &lt;/script&gt;&lt;b&gt;.vlog</title>"));
    }
}
