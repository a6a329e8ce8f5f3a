//! Crafted logs through the report commands: the input bytes choose records (events, stacks,
//! modules, code objects, thread names, samples, notes, marks, dumps) with extreme values
//! (u64::MAX sizes and addresses, i32::MIN/MAX devices, zero and huge times, time going
//! backwards, frees without allocations, stacks of up to 256 frames, unknown stack, code and
//! api ids, bogus module maps). They are encoded as a well-formed log, so that every record
//! reaches the replay and the analyses, and one command of the real `vramshim` reads it
//! (`report`, `peak`, `leaks`, `oom`, `timeline`, `flamegraph`, `diff`, `html` or
//! `export --pytorch-snapshot`, chosen by the first byte). Any panic, hang or huge allocation
//! is a finding; exit codes are not (a refused log is a correct answer).
#![no_main]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use vramshim_format::{
    ChunkBuilder, CodeDef, Dropped, DumpBegin, Event, EventKind, Exit, FORMAT_VERSION, Frame, Header,
    Mark, MemInfo, ModuleDef, Note, Record, StackDef, ThreadName,
};

/// Reads the fuzz input a byte at a time; zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&byte, rest)) => {
                self.0 = rest;
                byte
            }
            None => 0,
        }
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |value, _| value << 8 | u64::from(self.u8()))
    }

    fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[usize::from(self.u8()) % choices.len()]
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const TIMES: [u64; 6] = [0, 1, 1_000, 1_000_000_000, u64::MAX / 2, u64::MAX];
const DEVICES: [i32; 7] = [0, 1, -1, -2, 3, i32::MIN, i32::MAX];
const ADDRESSES: [u64; 6] = [
    0,
    0x1000,
    0x2000,
    0x7f00_0000_0000,
    u64::MAX - 0xfff,
    u64::MAX,
];
const SIZES: [u64; 6] = [0, 1, 512, 2 << 20, u64::MAX / 2, u64::MAX];
const STACK_IDS: [u32; 6] = [0, 1, 2, 3, 999, u32::MAX];
const CODE_IDS: [u32; 4] = [1, 2, 77, u32::MAX];
// Every kind, PyTorch's tensor events included (the tensor view's block model).
const KINDS: &[EventKind] = &EventKind::ALL;
const APIS: [&str; 8] = [
    "cudaMalloc",
    "cudaFree",
    "cuMemCreate",
    "cuMemRelease",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaMallocHost",
    "cuMemMap",
];
const MODULE_PATHS: [&str; 5] = ["/nonexistent/libx.so", "", "[vdso]", "/dev/null", "/"];

/// The record the next input bytes describe.
fn record(bytes: &mut Bytes<'_>, t_ns: &mut u64) -> Record {
    // Time mostly moves on a little, sometimes jumps or goes backwards.
    *t_ns = match bytes.u8() % 8 {
        0 => bytes.pick(&TIMES),
        1 => t_ns.saturating_sub(u64::from(bytes.u8())),
        _ => t_ns.saturating_add(u64::from(bytes.u8())),
    };
    let t_ns = *t_ns;
    match bytes.u8() % 16 {
        0 => Record::Stack(StackDef {
            id: bytes.pick(&STACK_IDS),
            frames: {
                let depth = usize::from(bytes.u8()) + 1;
                let base = bytes.pick(&ADDRESSES);
                (0..depth)
                    .map(|i| match bytes.u8() % 4 {
                        0 => Frame::Python {
                            code: bytes.pick(&CODE_IDS),
                            offset: u32::from(bytes.u8()),
                            entry: bytes.u8() % 2 == 0,
                        },
                        _ => Frame::Native(base.wrapping_add(i as u64 * 0x40)),
                    })
                    .collect()
            },
        }),
        1 => Record::Module(ModuleDef {
            path: bytes.pick(&MODULE_PATHS).to_owned(),
            load_bias: bytes.pick(&ADDRESSES),
            start: bytes.pick(&ADDRESSES),
            end: bytes.pick(&ADDRESSES),
            build_id: (0..bytes.u8() % 24).map(|_| bytes.u8()).collect(),
        }),
        2 => Record::Code(CodeDef {
            id: bytes.pick(&CODE_IDS),
            python: bytes.pick(&[0x0309, 0x030a, 0x030b, 0x030d, 0x030f, 0, 0xffff]),
            filename: "model.py".to_owned(),
            qualname: "Net.forward".to_owned(),
            first_line: bytes.pick(&[0, 1, 42, u32::MAX]),
            line_table: (0..bytes.u8() % 32).map(|_| bytes.u8()).collect(),
        }),
        3 => Record::ThreadName(ThreadName {
            thread: u32::from(bytes.u8() % 4),
            name: bytes
                .pick(&["", "python3", "pt_autograd_0", "\u{1F525}\n\"<&>"])
                .to_owned(),
        }),
        4 => Record::MemInfo(MemInfo {
            t_ns,
            device: bytes.pick(&DEVICES),
            free: bytes.pick(&SIZES),
            total: bytes.pick(&SIZES),
        }),
        5 => Record::Note(Note {
            t_ns,
            text: bytes
                .pick(&["fork", "exec", "python stacks unavailable: x"])
                .to_owned(),
        }),
        6 => Record::Dropped(Dropped {
            t_ns,
            count: bytes.pick(&SIZES),
        }),
        7 => Record::DumpBegin(DumpBegin {
            t_ns,
            reason: "crafted".to_owned(),
            events_discarded: bytes.pick(&SIZES),
            live_count: bytes.pick(&SIZES),
            window_count: bytes.pick(&SIZES),
        }),
        8 => Record::Mark(Mark {
            t_ns,
            thread: u32::from(bytes.u8() % 4),
            text: bytes
                .pick(&["epoch 3", "", "</script>", "a\u{2028}b"])
                .to_owned(),
        }),
        9 => Record::Exit(Exit { t_ns }),
        _ => {
            let kind = bytes.pick(KINDS);
            let failed = kind == EventKind::AllocFailed;
            Record::Event(Event {
                kind,
                api: bytes.pick(&[0, 1, 2, 3, 4, 5, 6, 7, 100, u16::MAX]),
                t_ns,
                thread: u32::from(bytes.u8() % 4),
                device: bytes.pick(&DEVICES),
                stream: bytes.pick(&ADDRESSES),
                addr: bytes.pick(&ADDRESSES),
                size: if bytes.u8() % 4 == 0 {
                    bytes.u64()
                } else {
                    bytes.pick(&SIZES)
                },
                handle: bytes.pick(&ADDRESSES),
                result: if failed {
                    2
                } else {
                    bytes.pick(&[0, 0, 0, 2, 700])
                },
                stack: bytes.pick(&STACK_IDS),
                mem_info: failed.then(|| (bytes.pick(&SIZES), bytes.pick(&SIZES))),
            })
        }
    }
}

/// The log the input describes: a header, then its records in chunks of at most 64.
fn log_of(bytes: &mut Bytes<'_>) -> Vec<u8> {
    let header = Header {
        version: FORMAT_VERSION,
        pid: 4242,
        ppid: 1,
        argv: vec!["fuzz".to_owned()],
        start_unix_ns: bytes.pick(&TIMES),
        start_mono_ns: bytes.pick(&TIMES),
        hostname: "fuzz".to_owned(),
        env: Vec::new(),
        apis: APIS.iter().map(|&api| api.to_owned()).collect(),
        stack_mode: "native".to_owned(),
        mode: bytes.pick(&["stream", "ring"]).to_owned(),
        recorder: "fuzz".to_owned(),
        // Times rounded down as `VRAMSHIM_TIME_RESOLUTION` makes the recorder write them.
        time_resolution_ns: bytes.pick(&[1, 1, 1_000, 10_000_000, u64::MAX]),
    };
    let mut out = header.encode();
    let mut chunk = ChunkBuilder::new().with_time_resolution(header.time_resolution_ns);
    let mut t_ns = 0;
    while !bytes.is_empty() {
        let record = record(bytes, &mut t_ns);
        chunk.push(&record);
        // A block's free right after its free request, as PyTorch reports most of them: one
        // record of format 7 (a free pair), when no chunk ends between them.
        if let Record::Event(request) = record
            && request.kind == EventKind::TensorFreeRequested
            && bytes.u8() % 2 == 0
        {
            t_ns = t_ns.saturating_add(u64::from(bytes.u8()));
            chunk.push(&Record::Event(Event {
                kind: EventKind::TensorFree,
                t_ns,
                stack: 0,
                ..request
            }));
        }
        if chunk.records() >= 64 {
            chunk.finish_into(&mut out);
        }
    }
    chunk.finish_into(&mut out);
    out
}

/// A scratch directory of this fuzzing process; stdout goes to /dev/null (the reports).
fn scratch() -> PathBuf {
    static SETUP: Once = Once::new();
    let dir = std::env::temp_dir().join(format!("vramshim-fuzz-report-{}", std::process::id()));
    SETUP.call_once(|| {
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null");
        // SAFETY: dup2 on two valid descriptors; stdout is only replaced, never closed.
        unsafe {
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1);
        }
    });
    dir
}

fuzz_target!(|data: &[u8]| {
    let mut bytes = Bytes(data);
    let command = bytes.u8();
    let dir = scratch();
    let log = dir.join("crafted.vlog");
    std::fs::File::create(&log)
        .and_then(|mut file| file.write_all(&log_of(&mut bytes)))
        .expect("write the crafted log");
    let log = log.to_string_lossy().into_owned();
    let out = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let args: Vec<String> = match command % 14 {
        0 => vec!["report".into(), log, "--json".into()],
        1 => vec!["report".into(), log],
        2 => vec!["peak".into(), log, "--by-thread".into()],
        3 => vec!["leaks".into(), log, "--json".into()],
        4 => vec!["oom".into(), log],
        5 => vec!["timeline".into(), log, "--json".into()],
        6 => vec![
            "flamegraph".into(),
            log,
            "--what".into(),
            "allocated".into(),
            "-o".into(),
            out("flame.svg"),
        ],
        7 => vec!["flamegraph".into(), log, "--folded".into()],
        8 => vec!["diff".into(), log.clone(), log, "--json".into()],
        9 => vec!["html".into(), log, "-o".into(), out("report.html")],
        10 => vec!["breakdown".into(), log, "--json".into()],
        11 => vec!["steps".into(), log],
        12 => vec!["advise".into(), log, "--json".into()],
        _ => vec![
            "export".into(),
            log,
            "--pytorch-snapshot".into(),
            "-o".into(),
            out("snapshot.json"),
        ],
    };
    let _ = vramshim_report::run(std::iter::once("vramshim".to_owned()).chain(args));
});
