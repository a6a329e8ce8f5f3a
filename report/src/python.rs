//! Python frames in reports: line numbers from CPython's line tables, and mixed stacks where
//! each native frame of the interpreter's eval loop gives way to the Python frames it ran.

use vramshim_format::CodeDef;

use crate::symbols::SymFrame;

/// [`SymFrame::module`] of a Python frame.
pub const PYTHON_MODULE: &str = "[python]";

/// The native function that runs Python frames; one call runs one group of them.
pub const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";

/// Which frames a report shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[repr(u8)]
pub enum StackView {
    /// Native frames, with the eval loop's frames replaced by the Python frames they ran.
    #[default]
    Mixed = 0,
    /// Python frames only (native frames where a stack has no Python frames).
    Python = 1,
    /// Native frames only.
    Native = 2,
}

/// One recorded Python frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyFrame {
    pub code: u32,
    /// Instruction, in code units from the start of the bytecode.
    pub offset: u32,
    /// The outermost frame run by one call of the eval loop.
    pub entry: bool,
}

/// The source line of the instruction at `offset` (code units), from a CPython 3.11+ location
/// table (`co_linetable`, see CPython's `Objects/locations.md`). `None` when the table has no
/// line for it or the version's table format is unknown.
pub fn line_of(code: &CodeDef, offset: u32) -> Option<u32> {
    if code.python < 0x030b {
        return None;
    }
    let table = &code.line_table;
    let target = u64::from(offset);
    let mut line = i64::from(code.first_line);
    let mut address = 0u64; // in code units
    let mut at = 0usize;
    while at < table.len() {
        let first = table[at];
        if first & 0x80 == 0 {
            return None; // not at an entry start: damaged table
        }
        let kind = (first >> 3) & 15;
        let length = u64::from(first & 7) + 1;
        at += 1;
        let (delta, has_line) = match kind {
            15 => (0, false),
            13 | 14 => (signed_varint(table, &mut at)?, true),
            10..=12 => (i64::from(kind - 10), true),
            _ => (0, true),
        };
        // Skip the rest of the entry (columns, end line): up to the next entry start.
        while at < table.len() && table[at] & 0x80 == 0 {
            at += 1;
        }
        line += delta;
        if target < address + length {
            return (has_line && line > 0).then_some(line as u32);
        }
        address += length;
    }
    None
}

fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0u32;
    loop {
        let byte = *table.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 63) << shift;
        if byte & 64 == 0 {
            return Some(value);
        }
        shift += 6;
        if shift > 60 {
            return None;
        }
    }
}

fn signed_varint(table: &[u8], at: &mut usize) -> Option<i64> {
    let value = varint(table, at)?;
    let magnitude = (value >> 1) as i64;
    Some(if value & 1 == 1 {
        -magnitude
    } else {
        magnitude
    })
}

/// The report's frame for a Python frame (`code` is `None` when its definition is missing).
pub fn sym_frame(code: Option<&CodeDef>, frame: PyFrame) -> SymFrame {
    match code {
        Some(code) => SymFrame {
            function: Some(code.qualname.clone()),
            file: Some(code.filename.clone()),
            line: line_of(code, frame.offset),
            module: PYTHON_MODULE.to_string(),
            offset: u64::from(frame.offset),
            inlined: false,
        },
        None => SymFrame {
            function: Some(format!("<python code {}>", frame.code)),
            file: None,
            line: None,
            module: PYTHON_MODULE.to_string(),
            offset: u64::from(frame.offset),
            inlined: false,
        },
    }
}

/// Splits Python frames (innermost first) into the groups each eval-loop call ran.
pub fn groups(frames: &[SymFrame], python: &[PyFrame]) -> Vec<Vec<SymFrame>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    for (frame, py) in frames.iter().zip(python) {
        current.push(frame.clone());
        if py.entry {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// A mixed stack: `native` holds the symbolised frames of each native return address
/// (innermost first); every address inside the eval loop is replaced by the next group of
/// Python frames. Groups left over (the native stack was cut at its depth limit) go outermost.
pub fn splice(native: Vec<Vec<SymFrame>>, groups: Vec<Vec<SymFrame>>) -> Vec<SymFrame> {
    let mut groups = groups.into_iter();
    let mut out = Vec::new();
    for frames in native {
        let in_eval = frames
            .iter()
            .any(|f| f.function.as_deref() == Some(EVAL_LOOP));
        match in_eval.then(|| groups.next()).flatten() {
            Some(group) => out.extend(group),
            None => out.extend(frames),
        }
    }
    for group in groups {
        out.extend(group);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(first_line: u32, table: Vec<u8>) -> CodeDef {
        CodeDef {
            id: 1,
            python: 0x030b,
            filename: "/x/m.py".into(),
            qualname: "f".into(),
            first_line,
            line_table: table,
        }
    }

    #[test]
    fn location_table_entries_give_lines() {
        // RESUME (no columns, line +0) 1 unit; one-line form +1 (2 units); long form +3
        // (1 unit); no location (1 unit); short form, same line (1 unit); no-column -1.
        let table = vec![
            0x80 | (13 << 3),
            0x00,
            0x80 | (11 << 3) | 1,
            4,
            9,
            0x80 | (14 << 3),
            6,
            0,
            1,
            5,
            0x80 | (15 << 3),
            0x80 | (2 << 3),
            0x21,
            0x80 | (13 << 3),
            3,
        ];
        let code = code(10, table);
        let lines: Vec<Option<u32>> = (0..8).map(|o| line_of(&code, o)).collect();
        assert_eq!(
            lines,
            [
                Some(10),
                Some(11),
                Some(11),
                Some(14),
                None,
                Some(14),
                Some(13),
                None
            ]
        );
        let older = CodeDef {
            python: 0x030a,
            ..code
        };
        assert_eq!(line_of(&older, 0), None);
    }

    #[test]
    fn damaged_tables_give_no_line() {
        assert_eq!(line_of(&code(5, vec![0x05]), 0), None);
        assert_eq!(line_of(&code(5, vec![0x80 | (13 << 3), 0x41]), 0), None);
        assert_eq!(line_of(&code(5, vec![]), 0), None);
    }

    fn named(name: &str) -> SymFrame {
        SymFrame {
            function: Some(name.to_string()),
            file: None,
            line: None,
            module: String::new(),
            offset: 0,
            inlined: false,
        }
    }

    #[test]
    fn splice_replaces_eval_frames_in_order() {
        let py = |code, entry| PyFrame {
            code,
            offset: 0,
            entry,
        };
        let python = [py(1, false), py(2, true), py(3, true), py(4, true)];
        let frames: Vec<SymFrame> = ["inner", "mid", "outer", "extra"].map(named).to_vec();
        let grouped = groups(&frames, &python);
        assert_eq!(grouped.len(), 3);
        let native = vec![
            vec![named("cudaMalloc")],
            vec![named("inlined_helper"), named(EVAL_LOOP)],
            vec![named("call")],
            vec![named(EVAL_LOOP)],
        ];
        let labels: Vec<String> = splice(native, grouped)
            .iter()
            .map(SymFrame::label)
            .collect();
        assert_eq!(
            labels,
            ["cudaMalloc", "inner", "mid", "call", "outer", "extra"]
        );
    }
}
