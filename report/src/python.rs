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

/// The source line of the instruction at `offset` (code units from the start of the
/// bytecode), from the code object's line table in its version's format. `None` when the table
/// has no line for it or the version's table format is unknown.
pub fn line_of(code: &CodeDef, offset: u32) -> Option<u32> {
    let line = match code.python {
        0x0309 => lnotab_line(code, offset),
        0x030a => pep626_line(code, offset),
        0x030b..=0x030e => location_table_line(code, offset)?,
        _ => return None,
    };
    u32::try_from(line).ok().filter(|&line| line > 0)
}

/// CPython 3.9's `co_lnotab`: (bytecode increment, signed line increment) byte pairs; the
/// line of byte address `a` adds up the line increments of the pairs whose address sum is at
/// most `a` (`PyCode_Addr2Line`).
fn lnotab_line(code: &CodeDef, offset: u32) -> i64 {
    let target = 2 * u64::from(offset);
    let mut line = i64::from(code.first_line);
    let mut address = 0u64;
    for pair in code.line_table.chunks_exact(2) {
        address += u64::from(pair[0]);
        if address > target {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

/// CPython 3.10's `co_linetable` (PEP 626): (bytecode length, signed line delta) byte pairs,
/// each covering the next `length` bytes of bytecode; a delta of -128 marks a range without a
/// line (`Objects/lnotab_notes.txt` of 3.10).
fn pep626_line(code: &CodeDef, offset: u32) -> i64 {
    let target = 2 * u64::from(offset);
    let mut line = i64::from(code.first_line);
    let mut end = 0u64;
    for pair in code.line_table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        if delta != i8::MIN {
            line += i64::from(delta);
        }
        if (start..end).contains(&target) {
            return if delta == i8::MIN { -1 } else { line };
        }
    }
    -1
}

/// CPython 3.11+'s location table (`co_linetable`, see CPython's `Objects/locations.md`).
/// `None` for a damaged table.
fn location_table_line(code: &CodeDef, offset: u32) -> Option<i64> {
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
            return Some(if has_line { line } else { -1 });
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
            function: Some(code.qualname.as_str().into()),
            file: Some(code.filename.as_str().into()),
            line: line_of(code, frame.offset),
            module: PYTHON_MODULE.into(),
            offset: u64::from(frame.offset),
            inlined: false,
        },
        None => SymFrame {
            function: Some(format!("<python code {}>", frame.code).into()),
            file: None,
            line: None,
            module: PYTHON_MODULE.into(),
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
        let unknown = CodeDef {
            python: 0x0308,
            ..code
        };
        assert_eq!(line_of(&unknown, 0), None);
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// Lines of every code unit of a real code object: `python` version, first line, line
    /// table (hex), and what the interpreter's own `PyCode_Addr2Line` says for each unit (-1:
    /// none).
    fn check_real(python: u16, first_line: u32, table: &str, want: &[i32]) {
        let code = CodeDef {
            python,
            ..code(first_line, hex(table))
        };
        let got: Vec<Option<u32>> = (0..want.len() as u32).map(|o| line_of(&code, o)).collect();
        let want: Vec<Option<u32>> = want.iter().map(|&l| u32::try_from(l).ok()).collect();
        assert_eq!(got, want, "{python:#x} {table}");
    }

    // The tables below are those of this source, compiled by each installed interpreter
    // (loop, negative line steps, a 300-line gap, a generator):
    //
    // def f(x):
    //     total = 0
    //     for i in range(x):
    //         if i % 2:
    //             total += i
    //         else:
    //             total -= (
    //                 i
    //             )
    //     return total
    //
    //
    // def far():
    //     a = 1
    //     <300 empty lines>
    //     return a
    //
    //
    // def gen(n):
    //     yield n

    #[test]
    fn lnotab_of_39_gives_lines() {
        check_real(
            0x0309,
            1,
            "000104010c0108010a02020102ff0603",
            &[
                2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 5, 7, 8, 7, 7, 7, 10, 10,
            ],
        );
        check_real(0x0309, 13, "0001047f007f002e", &[14, 14, 314, 314]);
        check_real(0x0309, 317, "0001", &[318, 318, 318, 318, 318]);
    }

    #[test]
    fn pep626_table_of_310_gives_lines() {
        check_real(
            0x030a,
            1,
            "04010c0108010a010202020106ff0403",
            &[
                2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 5, 7, 8, 7, 7, 7, 10, 10,
            ],
        );
        check_real(0x030a, 13, "0401007f007f042e", &[14, 14, 314, 314]);
        // GEN_START has no line (-128).
        check_real(0x030a, 317, "02800a01", &[-1, 318, 318, 318, 318, 318]);
        // Past the end of the table: no line.
        check_real(0x030a, 317, "02800a01", &[-1, 318, 318, 318, 318, 318, -1]);
    }

    #[test]
    fn location_table_of_313_gives_lines() {
        check_real(
            0x030d,
            1,
            "8000d80c0d8045dc0d1290318e588801d80b0c88718f35d80c11894a8a45e00c11d81011f103020d0e\
             8a45f109000e16f00e000c11804c",
            &[
                1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5,
                5, 5, 5, 5, 5, 7, 8, 7, 7, 7, 7, 7, 3, 3, 10, 10,
            ],
        );
        check_real(
            0x030d,
            13,
            "8000d808098041f05809000c0d8048",
            &[13, 14, 14, 314, 314],
        );
        check_real(
            0x030d,
            317,
            "e9008000d80a0b8347f9",
            &[317, 317, 317, 318, 318, 318, 318, 318, -1, -1],
        );
    }

    #[test]
    fn damaged_tables_give_no_line() {
        assert_eq!(line_of(&code(5, vec![0x05]), 0), None);
        assert_eq!(line_of(&code(5, vec![0x80 | (13 << 3), 0x41]), 0), None);
        assert_eq!(line_of(&code(5, vec![]), 0), None);
        for python in [0x0309, 0x030a] {
            let code = CodeDef {
                python,
                ..code(5, vec![])
            };
            // 3.9: an empty lnotab leaves every instruction on the first line.
            assert_eq!(line_of(&code, 3), (python == 0x0309).then_some(5));
            let odd = CodeDef {
                line_table: vec![4],
                ..code
            };
            assert_eq!(line_of(&odd, 0), (python == 0x0309).then_some(5));
        }
    }

    fn named(name: &str) -> SymFrame {
        SymFrame {
            function: Some(name.into()),
            file: None,
            line: None,
            module: "".into(),
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

    #[test]
    fn splice_gives_every_frame_its_own_eval_call_before_311() {
        // 3.9 / 3.10: each Python call is one native call of the eval loop, so the shim marks
        // every frame as an entry; the wrappers between eval-loop calls stay.
        let python = [1, 2, 3].map(|code| PyFrame {
            code,
            offset: 0,
            entry: true,
        });
        let frames: Vec<SymFrame> = ["inner", "outer", "<module>"].map(named).to_vec();
        let grouped = groups(&frames, &python);
        assert_eq!(grouped.len(), 3);
        let native = vec![
            vec![named("cudaMalloc")],
            vec![named("_PyObject_MakeTpCall")],
            vec![named("call_function"), named(EVAL_LOOP)],
            vec![named("_PyEval_EvalFrame"), named("_PyEval_Vector")],
            vec![named(EVAL_LOOP)],
            vec![named("_PyEval_Vector")],
            vec![named(EVAL_LOOP)],
            vec![named("PyEval_EvalCode")],
        ];
        let labels: Vec<String> = splice(native, grouped)
            .iter()
            .map(SymFrame::label)
            .collect();
        assert_eq!(
            labels,
            [
                "cudaMalloc",
                "_PyObject_MakeTpCall",
                "inner",
                "_PyEval_EvalFrame",
                "_PyEval_Vector",
                "outer",
                "_PyEval_Vector",
                "<module>",
                "PyEval_EvalCode"
            ]
        );
    }
}
