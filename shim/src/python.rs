//! Python call stacks, read raw from the calling thread's own interpreter frames.
//!
//! PyTorch releases the GIL before it allocates, so the hook cannot use the C API. It reads
//! the thread's frame chain directly instead: while the hook runs the chain is frozen (this
//! thread is executing the hook) and every code object on it is kept alive by its frame. No
//! GIL, no Python lock, no Python code, no allocation (except the first time a code object is
//! seen, when its definition is written to the log, and a thread's first walk, which makes
//! room to remember it: a walk whose frames all read as the last one's copies its result).
//!
//! Struct offsets come from the interpreter itself on 3.13 and later (`_Py_DebugOffsets`, at the
//! start of the exported `_PyRuntime`), and from a table per minor version before that (derived
//! from the interpreter's own headers by `scripts/py-offsets.sh`). Either way they are checked
//! once against the running interpreter: the first frame read must point at objects of the
//! code, str and bytes types (3.9 / 3.10: and be a frame object), read through fault-proof
//! system calls. Any mismatch, a version without a layout or a free-threaded build turns Python
//! capture off for the process with one note in the log; native stacks go on.
//!
//! Two frame models:
//! - 3.9 / 3.10: `tstate->frame` is a `PyFrameObject` chain (`f_back`, `f_code`, `f_lasti`).
//!   Every Python call is its own native call of the eval loop, so every frame is an entry.
//! - 3.11+: `_PyInterpreterFrame` chain; one eval-loop call runs several frames (entries are
//!   marked by `is_entry` on 3.11, by a C-stack-owned shim frame from 3.12).

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::mem::MaybeUninit;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use vramshim_format::{CodeDef, Note, Record};

use crate::{real, writer};

/// Most Python frames kept per stack.
pub const MAX_PY_FRAMES: usize = 256;
/// Words of a stack key per Python frame: code address, identity check, offset and entry bit.
pub const WORDS_PER_FRAME: usize = 3;
/// Marks the last word of a stack key that holds Python frames (low 32 bits: their count).
/// No native return address has these top bits.
pub const PY_KEY_TAG: u64 = 0xfffe_0000_0000_0000;

/// Versions with a frame layout, for notes.
const SUPPORTED: &str = "3.9 to 3.14";

/// Where a frame keeps its current instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Instr {
    /// 3.9: `f_lasti`, an `int` offset in bytes (-1 before the first instruction).
    LastiBytes,
    /// 3.10: `f_lasti`, an `int` index in code units (-1 before the first instruction).
    LastiUnits,
    /// 3.11+: a pointer into the code object's `co_code_adaptive` (`prev_instr`; `instr_ptr`
    /// from 3.13).
    Pointer,
}

/// Offsets into the interpreter's structures for one minor version (non-debug builds, where
/// `ob_type` is at 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    minor: u8,
    /// The thread state's frame field: `frame` (3.9 / 3.10), `cframe` (3.11 / 3.12, a
    /// `_PyCFrame*` whose current frame is at `cframe_current`), `current_frame` (3.13+).
    tstate_frame: usize,
    cframe_current: Option<usize>,
    /// `f_code` (3.13+: `f_executable`).
    frame_code: usize,
    /// Low bits of the code reference that tag it rather than address it (3.14: a
    /// `_PyStackRef`).
    code_tag_bits: u64,
    /// `f_back` (3.9 / 3.10), `previous` (3.11+).
    frame_previous: usize,
    frame_instr: usize,
    instr: Instr,
    /// 3.11: `is_entry`; 3.12 marks entries with a C-stack-owned frame instead.
    frame_is_entry: Option<usize>,
    /// `owner` (3.11+).
    frame_owner: Option<usize>,
    owner_generator: u8,
    /// 3.12+: owners from this value up mark the C-stack frame each eval-loop call pushes
    /// (`FRAME_OWNED_BY_CSTACK`, 3; 3.14 calls it `FRAME_OWNED_BY_INTERPRETER`).
    owner_cstack: Option<u8>,
    code_filename: usize,
    /// `co_qualname` (3.11+); `co_name` before, which has no class or enclosing function.
    code_name: usize,
    code_firstlineno: usize,
    /// `co_linetable` (3.10+), `co_lnotab` (3.9).
    code_linetable: usize,
    /// `_co_firsttraceable` (3.11 to 3.13; not published on 3.14).
    code_firsttraceable: Option<usize>,
    /// `co_code_adaptive` (3.11+).
    code_adaptive: usize,
    unicode_ascii_data: usize,
    unicode_compact_data: usize,
}

const OB_TYPE: usize = 8;
const UNICODE_LENGTH: usize = 16;
const UNICODE_STATE: usize = 32;
const BYTES_SIZE: usize = 16;
const BYTES_DATA: usize = 32;

/// CPython 3.9 (scripts/py-offsets.sh on 3.9.18).
const PY39: Layout = Layout {
    minor: 9,
    tstate_frame: 24,
    cframe_current: None,
    frame_code: 32,
    code_tag_bits: 0,
    frame_previous: 24,
    frame_instr: 104,
    instr: Instr::LastiBytes,
    frame_is_entry: None,
    frame_owner: None,
    owner_generator: 0,
    owner_cstack: None,
    code_filename: 104,
    code_name: 112,
    code_firstlineno: 40,
    code_linetable: 120,
    code_firsttraceable: None,
    code_adaptive: 0,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
};

/// CPython 3.10 (scripts/py-offsets.sh on 3.10.13).
const PY310: Layout = Layout {
    minor: 10,
    frame_instr: 96,
    instr: Instr::LastiUnits,
    ..PY39
};

/// CPython 3.11 (scripts/py-offsets.sh on 3.11.7).
const PY311: Layout = Layout {
    minor: 11,
    tstate_frame: 56,
    cframe_current: Some(8),
    frame_code: 32,
    code_tag_bits: 0,
    frame_previous: 48,
    frame_instr: 56,
    instr: Instr::Pointer,
    frame_is_entry: Some(68),
    frame_owner: Some(69),
    owner_generator: 1,
    owner_cstack: None,
    code_filename: 112,
    code_name: 128,
    code_firstlineno: 72,
    code_linetable: 136,
    code_firsttraceable: Some(168),
    code_adaptive: 184,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
};

/// CPython 3.12 (scripts/py-offsets.sh on 3.12.1).
const PY312: Layout = Layout {
    minor: 12,
    tstate_frame: 56,
    cframe_current: Some(0),
    frame_code: 0,
    code_tag_bits: 0,
    frame_previous: 8,
    frame_instr: 56,
    instr: Instr::Pointer,
    frame_is_entry: None,
    frame_owner: Some(70),
    owner_generator: 1,
    owner_cstack: Some(3),
    code_filename: 112,
    code_name: 128,
    code_firstlineno: 68,
    code_linetable: 136,
    code_firsttraceable: Some(176),
    code_adaptive: 192,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
};

/// Words of `_Py_DebugOffsets` before its first section: the cookie, the version and the
/// free-threaded flag.
const DEBUG_HEADER_WORDS: usize = 3;

/// The sections of `_Py_DebugOffsets` up to the unicode object's, in order, with their sizes
/// in words. The struct changes between minor versions (never within one).
/// 3.13: Include/internal/pycore_runtime.h of 3.13.0.
const DEBUG_SECTIONS_313: &[(&str, usize)] = &[
    ("runtime_state", 3),
    ("interpreter_state", 13),
    ("thread_state", 9),
    ("interpreter_frame", 6),
    ("code_object", 10),
    ("pyobject", 2),
    ("type_object", 4),
    ("tuple_object", 3),
    ("list_object", 3),
    ("dict_object", 3),
    ("float_object", 2),
    ("long_object", 3),
    ("bytes_object", 3),
    ("unicode_object", 4),
];

/// 3.14 (Include/internal/pycore_debug_offsets.h; untested: no 3.14 was at hand). The
/// interpreter state gained `threads_main`, `code_object_generation` and `tlbc_generation`, the
/// frame `stackpointer` and `tlbc_index`, the code object `co_tlbc`, and a set section came in.
/// Sections that do not line up fail the exact checks in [`layout_from_debug_offsets`].
const DEBUG_SECTIONS_314: &[(&str, usize)] = &[
    ("runtime_state", 3),
    ("interpreter_state", 16),
    ("thread_state", 9),
    ("interpreter_frame", 8),
    ("code_object", 11),
    ("pyobject", 2),
    ("type_object", 4),
    ("tuple_object", 3),
    ("list_object", 3),
    ("set_object", 4),
    ("dict_object", 3),
    ("float_object", 2),
    ("long_object", 3),
    ("bytes_object", 3),
    ("unicode_object", 4),
];

/// Most words of `_Py_DebugOffsets` read.
const DEBUG_WORDS_MAX: usize = 96;

fn debug_sections(minor: u8) -> Option<&'static [(&'static str, usize)]> {
    match minor {
        13 => Some(DEBUG_SECTIONS_313),
        14 => Some(DEBUG_SECTIONS_314),
        _ => None,
    }
}

/// Words of `_Py_DebugOffsets` a layout is read from.
fn debug_words(sections: &[(&str, usize)]) -> usize {
    DEBUG_HEADER_WORDS + sections.iter().map(|&(_, n)| n).sum::<usize>()
}

/// The layout of CPython 3.`minor` (3.13+) from its `_Py_DebugOffsets`: `words` from the start
/// of `_PyRuntime`. Every offset used must lie inside its structure, and the object header,
/// `bytes` and `str` offsets, which never change, must be the known ones: a section table that
/// does not fit the interpreter fails these checks.
fn layout_from_debug_offsets(minor: u8, words: &[u64]) -> Result<Layout, String> {
    let sections = debug_sections(minor)
        .ok_or_else(|| format!("no frame layout for CPython 3.{minor} (supported: {SUPPORTED})"))?;
    if words.len() < debug_words(sections) || words[0].to_le_bytes() != *b"xdebugpy" {
        return Err(format!(
            "CPython 3.{minor}'s _PyRuntime does not begin with _Py_DebugOffsets"
        ));
    }
    let version = words[1];
    if (version >> 24, (version >> 16) & 0xff) != (3, u64::from(minor)) {
        return Err(format!(
            "CPython 3.{minor}'s _Py_DebugOffsets are for version {version:#x}"
        ));
    }
    if words[2] != 0 {
        return Err(format!(
            "free-threaded CPython 3.{minor} (no frame layout for free-threaded builds)"
        ));
    }
    let get = |section: &str, index: usize| -> u64 {
        let mut at = DEBUG_HEADER_WORDS;
        for &(name, size) in sections {
            if name == section {
                return if index < size {
                    words[at + index]
                } else {
                    u64::MAX
                };
            }
            at += size;
        }
        u64::MAX
    };
    let bad = |what: &str| {
        Err(format!(
            "CPython 3.{minor}'s _Py_DebugOffsets are not as expected ({what})"
        ))
    };
    let tstate_size = get("thread_state", 0);
    let current_frame = get("thread_state", 4);
    let frame_size = get("interpreter_frame", 0);
    let [previous, executable, instr_ptr, owner] =
        [1, 2, 3, 5].map(|i| get("interpreter_frame", i));
    let code_size = get("code_object", 0);
    let [filename, qualname, linetable, firstlineno, adaptive] =
        [1, 3, 4, 5, 9].map(|i| get("code_object", i));
    if [get("pyobject", 0), get("pyobject", 1)] != [16, OB_TYPE as u64] {
        return bad("object header");
    }
    if [get("bytes_object", 1), get("bytes_object", 2)] != [BYTES_SIZE as u64, BYTES_DATA as u64] {
        return bad("bytes object");
    }
    let ascii_size = get("unicode_object", 3);
    if [get("unicode_object", 1), get("unicode_object", 2)]
        != [UNICODE_STATE as u64, UNICODE_LENGTH as u64]
        || !(UNICODE_STATE as u64 + 8..=64).contains(&ascii_size)
        || !ascii_size.is_multiple_of(8)
    {
        return bad("str object");
    }
    // A pointer field: aligned and inside a structure of `size` bytes.
    let pointer_in = |offset: u64, size: u64| offset.is_multiple_of(8) && offset + 8 <= size;
    if !(64..=1 << 16).contains(&tstate_size) || !pointer_in(current_frame, tstate_size) {
        return bad("thread state");
    }
    if !(32..=512).contains(&frame_size)
        || ![previous, executable, instr_ptr]
            .iter()
            .all(|&o| pointer_in(o, frame_size))
        || owner >= frame_size
    {
        return bad("interpreter frame");
    }
    if !(64..=2048).contains(&code_size)
        || ![filename, qualname, linetable]
            .iter()
            .all(|&o| pointer_in(o, code_size))
        || !firstlineno.is_multiple_of(4)
        || firstlineno + 4 > code_size
        || !(32..=code_size).contains(&adaptive)
    {
        return bad("code object");
    }
    let at = |offset: u64| offset as usize;
    Ok(Layout {
        minor,
        tstate_frame: at(current_frame),
        cframe_current: None,
        frame_code: at(executable),
        code_tag_bits: if minor >= 14 { 7 } else { 0 },
        frame_previous: at(previous),
        frame_instr: at(instr_ptr),
        instr: Instr::Pointer,
        frame_is_entry: None,
        frame_owner: Some(at(owner)),
        owner_generator: 1,
        owner_cstack: Some(3),
        code_filename: at(filename),
        code_name: at(qualname),
        code_firstlineno: at(firstlineno),
        code_linetable: at(linetable),
        // 3.13: `int _co_firsttraceable; void *co_extra; char co_code_adaptive[]`.
        code_firsttraceable: (minor == 13).then(|| at(adaptive) - 16),
        code_adaptive: at(adaptive),
        unicode_ascii_data: at(ascii_size),
        // `PyCompactUnicodeObject` adds `utf8_length` and `utf8` (3.12+).
        unicode_compact_data: at(ascii_size) + 16,
    })
}

struct Runtime {
    layout: Layout,
    /// `major << 8 | minor`.
    version: u16,
    get_tstate: unsafe extern "C" fn() -> *mut c_void,
    code_type: u64,
    unicode_type: u64,
    bytes_type: u64,
    /// `PyFrame_Type` (checked on 3.9 / 3.10, whose frames are objects).
    frame_type: u64,
}

const UNKNOWN: u8 = 0;
const PROBING: u8 = 1;
/// Layout chosen, not yet checked against a live frame.
const UNVERIFIED: u8 = 2;
const ON: u8 = 3;
const OFF: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Code objects already defined in the log: (address, identity word) → id.
static CODES: crate::sync::Lock<Option<CodeMap>> = crate::sync::Lock::new(None);

/// The map behind [`CODES`], hashed by FxHash: std's SipHash took 209 of a lookup's ~300
/// instructions (training steps under callgrind, 1,213 lookups as new stacks were defined),
/// and code addresses and identity words are process-local values no outside input chooses.
type CodeMap = HashMap<(u64, u64), u32, rustc_hash::FxBuildHasher>;
static NEXT_CODE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// Turns Python capture off for good, with a note saying why.
fn give_up(why: &str) {
    if STATE.swap(OFF, Ordering::AcqRel) != OFF {
        writer::define(Record::Note(Note {
            t_ns: 0,
            text: format!("python stacks unavailable: {why}; recording native stacks only"),
        }));
        crate::debug(format_args!("python stacks unavailable: {why}"));
    }
}

fn symbol(name: &CStr) -> *mut c_void {
    real::real_dlsym(libc::RTLD_DEFAULT, name)
}

/// `(major, minor)` from a version string such as `3.10.13 (main, ...)`.
fn parse_version(text: &[u8]) -> Option<(u8, u8)> {
    let mut parts = text.split(|&b| b == b'.');
    let number = |part: &[u8]| -> Option<u8> {
        if part.is_empty() || part.len() > 3 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let major = number(parts.next()?)?;
    let minor = parts.next()?;
    let digits = minor.iter().take_while(|b| b.is_ascii_digit()).count();
    Some((major, number(&minor[..digits])?))
}

/// The running interpreter's `(major, minor)`: `Py_Version` (3.11+), else the text of
/// `Py_GetVersion()`, which needs no GIL and only formats constants.
fn interpreter_version() -> Option<(u8, u8)> {
    let hex = symbol(c"Py_Version");
    if !hex.is_null() {
        // PY_VERSION_HEX: 0xMMmmPPRS.
        let hex = unsafe { (hex as *const u32).read() };
        return Some(((hex >> 24) as u8, (hex >> 16) as u8));
    }
    let get = symbol(c"Py_GetVersion");
    if get.is_null() {
        return None;
    }
    let get: unsafe extern "C" fn() -> *const c_char = unsafe { std::mem::transmute(get) };
    let text = unsafe { get() };
    if text.is_null() {
        return None;
    }
    let text = unsafe { CStr::from_ptr(text) }.to_bytes();
    parse_version(&text[..text.len().min(16)])
}

/// The layout of `_Py_DebugOffsets` in the running 3.`minor` (3.13+).
fn runtime_layout(minor: u8) -> Result<Layout, String> {
    let runtime = symbol(c"_PyRuntime") as u64;
    let count = debug_sections(minor).map_or(0, debug_words);
    let mut words = [0u64; DEBUG_WORDS_MAX];
    if runtime == 0 || count > DEBUG_WORDS_MAX {
        return Err(format!("CPython 3.{minor} does not export _PyRuntime"));
    }
    for (i, word) in words[..count].iter_mut().enumerate() {
        *word = checked_read(runtime + 8 * i as u64)
            .ok_or_else(|| format!("CPython 3.{minor}'s _PyRuntime could not be read"))?;
    }
    layout_from_debug_offsets(minor, &words[..count])
}

/// Finds the interpreter and picks its layout (once; again later while Python is present
/// but not initialised yet). Returns whether frames may be read now.
fn probe() -> bool {
    if STATE
        .compare_exchange(UNKNOWN, PROBING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    let initialized = symbol(c"Py_IsInitialized");
    if initialized.is_null() {
        // No Python in this process: nothing to say.
        STATE.store(OFF, Ordering::Release);
        return false;
    }
    let initialized: unsafe extern "C" fn() -> i32 = unsafe { std::mem::transmute(initialized) };
    if unsafe { initialized() } == 0 {
        STATE.store(UNKNOWN, Ordering::Release);
        return false;
    }
    let Some((major, minor)) = interpreter_version() else {
        give_up("the CPython version could not be read");
        return false;
    };
    let table = match (major, minor) {
        (3, 9) => Ok(PY39),
        (3, 10) => Ok(PY310),
        (3, 11) => Ok(PY311),
        (3, 12) => Ok(PY312),
        (3, 13..) if debug_sections(minor).is_some() => runtime_layout(minor),
        _ => Err(format!(
            "no frame layout for CPython {major}.{minor} (supported: {SUPPORTED})"
        )),
    };
    let mut layout = match table {
        Ok(layout) => layout,
        Err(why) => {
            give_up(&why);
            return false;
        }
    };
    if std::env::var_os("VRAMSHIM_TEST_PY_LAYOUT_BREAK").is_some_and(|v| v == "1") {
        // Test hook: a wrong offset must be caught by the check, never followed.
        layout.frame_code += 8;
    }
    let get_tstate = symbol(c"PyGILState_GetThisThreadState");
    let types = [
        c"PyCode_Type",
        c"PyUnicode_Type",
        c"PyBytes_Type",
        c"PyFrame_Type",
    ]
    .map(symbol);
    if get_tstate.is_null() || types.iter().any(|t| t.is_null()) {
        give_up(&format!("CPython {major}.{minor} lacks an expected symbol"));
        return false;
    }
    let runtime = Runtime {
        layout,
        version: u16::from(major) << 8 | u16::from(minor),
        get_tstate: unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_void>(get_tstate)
        },
        code_type: types[0] as u64,
        unicode_type: types[1] as u64,
        bytes_type: types[2] as u64,
        frame_type: types[3] as u64,
    };
    let _ = RUNTIME.set(runtime);
    STATE.store(UNVERIFIED, Ordering::Release);
    crate::debug(format_args!("python {major}.{minor} found"));
    true
}

/// Reads 8 bytes at `addr` without ever faulting (for the one-time checks).
fn checked_read(addr: u64) -> Option<u64> {
    if addr == 0 || !addr.is_multiple_of(8) {
        return None;
    }
    let mut value = 0u64;
    let local = libc::iovec {
        iov_base: (&raw mut value).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: 8,
    };
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == 8 {
        return Some(value);
    }
    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EFAULT) {
        return None;
    }
    // process_vm_readv refused (seccomp): a pipe write fails with EFAULT instead of faulting.
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let written = unsafe { libc::write(fds[1], addr as *const c_void, 8) };
    let read = if written == 8 {
        unsafe { libc::read(fds[0], (&raw mut value).cast(), 8) }
    } else {
        -1
    };
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    (read == 8).then_some(value)
}

/// Checks the layout on the first live frame: the frame (3.9 / 3.10: a frame object), its
/// code object, and the code object's file name, name and line table must have the expected
/// types.
fn verify(rt: &Runtime, frame: u64) -> bool {
    let l = &rt.layout;
    let check = || -> Option<()> {
        if l.instr != Instr::Pointer {
            (checked_read(frame + OB_TYPE as u64)? == rt.frame_type).then_some(())?;
        }
        let code = checked_read(frame + l.frame_code as u64)? & !l.code_tag_bits;
        (checked_read(code + OB_TYPE as u64)? == rt.code_type).then_some(())?;
        for (field, ty) in [
            (l.code_filename, rt.unicode_type),
            (l.code_name, rt.unicode_type),
            (l.code_linetable, rt.bytes_type),
        ] {
            let object = checked_read(code + field as u64)?;
            (checked_read(object + OB_TYPE as u64)? == ty).then_some(())?;
        }
        let previous = checked_read(frame + l.frame_previous as u64)?;
        (previous.is_multiple_of(8)).then_some(())
    };
    check().is_some()
}

#[inline]
unsafe fn word(addr: u64) -> u64 {
    unsafe { (addr as *const u64).read() }
}

#[inline]
unsafe fn byte(addr: u64) -> u8 {
    unsafe { (addr as *const u8).read() }
}

#[inline]
unsafe fn int(addr: u64) -> i32 {
    unsafe { (addr as *const i32).read() }
}

/// Writes the calling thread's Python frames (innermost first) into `out` as
/// [`WORDS_PER_FRAME`] words each; returns how many frames (0 when the thread runs no Python
/// code or Python capture is off) and the serial number of the remembered walk that found
/// them (0: not remembered). When that serial is `known` (non-zero), the frames are the ones
/// found under it before and are not written again.
pub fn walk(out: &mut [MaybeUninit<u64>], known: u64) -> (usize, u64) {
    let mut state = STATE.load(Ordering::Acquire);
    if state == UNKNOWN {
        probe();
        state = STATE.load(Ordering::Acquire);
    }
    if state != ON && state != UNVERIFIED {
        return (0, 0);
    }
    let Some(rt) = RUNTIME.get() else {
        return (0, 0);
    };
    let l = &rt.layout;
    let tstate = unsafe { (rt.get_tstate)() } as u64;
    if tstate == 0 || !tstate.is_multiple_of(8) {
        return (0, 0);
    }
    let mut frame = unsafe { word(tstate + l.tstate_frame as u64) };
    if let Some(current) = l.cframe_current {
        if frame == 0 || !frame.is_multiple_of(8) {
            return (0, 0);
        }
        frame = unsafe { word(frame + current as u64) };
    }
    if state == UNVERIFIED {
        // Skip C-stack shim frames to reach a real one.
        let mut first = frame;
        if let (Some(owner_at), Some(cstack)) = (l.frame_owner, l.owner_cstack) {
            while first != 0 && first.is_multiple_of(8) {
                let at = first + owner_at as u64;
                let owner = checked_read(at & !7).map(|w| (w >> ((at & 7) * 8)) as u8);
                if owner.is_none_or(|owner| owner < cstack) {
                    break;
                }
                first = checked_read(first + l.frame_previous as u64).unwrap_or(0);
            }
        }
        if first == 0 {
            return (0, 0);
        }
        if !verify(rt, first) {
            give_up(&format!(
                "the frame layout of CPython 3.{} does not match the running interpreter",
                l.minor
            ));
            return (0, 0);
        }
        let _ = STATE.compare_exchange(UNVERIFIED, ON, Ordering::AcqRel, Ordering::Acquire);
    }
    let max = (out.len() / WORDS_PER_FRAME).min(MAX_PY_FRAMES);
    let set = thread_memo(l, frame);
    if let Some(set) = unsafe { set.as_ref() } {
        for memo in &set.ways {
            if let Some(count) = memo.replay(l, frame, out, max, known) {
                return (count, memo.serial);
            }
        }
    }
    let mut memo = unsafe { set.as_mut() }.map(MemoSet::victim);
    if let Some(memo) = memo.as_deref_mut() {
        memo.valid = false;
        memo.frames.clear();
    }
    let mut visited = 0usize;
    let mut count = 0usize;
    let mut steps = 0usize;
    // Marks the frame recorded last as the outermost one of its eval-loop call.
    let end_group = |out: &mut [MaybeUninit<u64>], count: usize| {
        if count > 0 {
            // SAFETY: the words of the `count` frames recorded so far are written.
            unsafe { *out[(count - 1) * WORDS_PER_FRAME + 2].assume_init_mut() |= 1 };
        }
    };
    while frame != 0 && count < max && steps < 4 * MAX_PY_FRAMES {
        steps += 1;
        if !frame.is_multiple_of(8) {
            break;
        }
        if let Some(memo) = memo.as_deref_mut()
            && visited < MEMO_FRAMES
        {
            memo.frames.push(unsafe { frame_words(l, frame) });
        }
        visited += 1;
        let previous = unsafe { word(frame + l.frame_previous as u64) };
        let owner = l.frame_owner.map(|at| unsafe { byte(frame + at as u64) });
        if owner.zip(l.owner_cstack).is_some_and(|(o, c)| o >= c) {
            // The eval loop's entry marker: the frame above it began a native eval call.
            end_group(out, count);
            frame = previous;
            continue;
        }
        if l.instr != Instr::Pointer && unsafe { word(frame + OB_TYPE as u64) } != rt.frame_type {
            break;
        }
        let code = unsafe { word(frame + l.frame_code as u64) } & !l.code_tag_bits;
        if code == 0
            || !code.is_multiple_of(8)
            || unsafe { word(code + OB_TYPE as u64) } != rt.code_type
        {
            break;
        }
        let (offset, entry) = match l.instr {
            Instr::LastiBytes | Instr::LastiUnits => {
                // -1: not started yet; its first instruction is the nearest.
                let lasti = u64::from(unsafe { int(frame + l.frame_instr as u64) }.max(0) as u32);
                let units = if l.instr == Instr::LastiBytes {
                    lasti / 2
                } else {
                    lasti
                };
                // One native eval-loop call per Python frame.
                (units, true)
            }
            Instr::Pointer => {
                let entry = l
                    .frame_is_entry
                    .is_some_and(|at| unsafe { byte(frame + at as u64) } != 0);
                let instr = unsafe { word(frame + l.frame_instr as u64) };
                let start = code + l.code_adaptive as u64;
                let first_traceable = l.code_firsttraceable.map_or(0, |at| unsafe {
                    u64::from(int(code + at as u64).max(0) as u32)
                });
                let incomplete = owner != Some(l.owner_generator)
                    && (instr < start || instr < start + 2 * first_traceable);
                if incomplete {
                    // Not started yet (the interpreter hides these too); keep the group
                    // boundary.
                    if entry {
                        end_group(out, count);
                    }
                    frame = previous;
                    continue;
                }
                ((instr - start) / 2, entry)
            }
        };
        let at = count * WORDS_PER_FRAME;
        out[at].write(code);
        out[at + 1].write(identity(l, code));
        out[at + 2].write((offset.min(u64::from(u32::MAX)) << 1) | u64::from(entry));
        count += 1;
        frame = previous;
    }
    // The outermost frame always ends a group.
    end_group(out, count);
    // Remembered only when the walk reached the end of the chain (not a limit or a check).
    if let Some(memo) = memo
        && frame == 0
        && visited <= MEMO_FRAMES
    {
        let words = count * WORDS_PER_FRAME;
        memo.out.clear();
        memo.out.extend(out[..words].iter().map(|word| {
            // SAFETY: the words of the `count` frames recorded are written.
            unsafe { word.assume_init() }
        }));
        memo.count = count;
        memo.serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        memo.valid = true;
        return (count, memo.serial);
    }
    (count, 0)
}

/// Frames one remembered walk may have visited (deeper stacks are walked every time).
const MEMO_FRAMES: usize = 128;

/// What a walk reads of one frame and its result depends on: the frame's address, its
/// caller, its code, the word holding its instruction, and the word holding its owner and
/// entry flags (3.9 / 3.10: its type).
type FrameWords = [u64; 5];

unsafe fn frame_words(l: &Layout, frame: u64) -> FrameWords {
    unsafe { frame_words_at(l, flags_at(l), frame) }
}

/// Where a frame's owner and entry flags are (3.9 / 3.10: its type).
fn flags_at(l: &Layout) -> usize {
    l.frame_owner.or(l.frame_is_entry).unwrap_or(OB_TYPE)
}

/// [`frame_words`] with [`flags_at`] worked out once for a whole walk.
#[inline(always)]
unsafe fn frame_words_at(l: &Layout, flags_at: usize, frame: u64) -> FrameWords {
    let aligned = |at: usize| unsafe { word((frame + at as u64) & !7) };
    [
        frame,
        unsafe { word(frame + l.frame_previous as u64) },
        unsafe { word(frame + l.frame_code as u64) },
        aligned(l.frame_instr),
        aligned(flags_at),
    ]
}

/// A thread's last complete walk from one innermost frame ([`MemoTable`]): the words it read
/// of every frame it visited, and what it wrote. Between two allocations at a hot site most
/// frames stay where they are, running the same instruction; if every visited frame reads the
/// same, the walk finds the same frames, and reading five words a frame is cheaper than
/// walking it (which also reads each code object). A frame at the same place with the same
/// code pointer runs that code object: a live frame keeps its code alive (a code object freed
/// and another built at its address, run by a new frame at the same place and instruction,
/// would pass unseen).
struct LastWalk {
    valid: bool,
    /// The words of each frame visited, innermost first (at most [`MEMO_FRAMES`]).
    frames: Vec<FrameWords>,
    count: usize,
    /// The words written for the `count` frames recorded.
    out: Vec<u64>,
    /// Names this walk's result among every walk remembered in the process ([`SERIAL`]).
    serial: u64,
}

/// The last serial number given to a remembered walk: a caller that kept what a walk found
/// under its serial needs no copy of the frames when the next walk replays the same one.
static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl LastWalk {
    /// The frame count, with the frames written to `out` (unless `known` is this walk's
    /// serial), if a walk from `frame` would find what the last one found.
    fn replay(
        &self,
        l: &Layout,
        mut frame: u64,
        out: &mut [MaybeUninit<u64>],
        max: usize,
        known: u64,
    ) -> Option<usize> {
        if !self.valid || self.count > max {
            return None;
        }
        let flags_at = flags_at(l);
        for visited in &self.frames {
            // The same address as a frame visited before: non-null and aligned.
            if frame != visited[0] {
                return None;
            }
            let words = unsafe { frame_words_at(l, flags_at, frame) };
            // Inline, without branches per word (an array compare here was a memcmp call).
            let differ = words
                .iter()
                .zip(visited)
                .fold(0, |differ, (word, seen)| differ | (word ^ seen));
            if differ != 0 {
                return None;
            }
            frame = words[1];
        }
        if frame != 0 {
            return None;
        }
        if known != 0 && known == self.serial {
            return Some(self.count);
        }
        let words = self.count * WORDS_PER_FRAME;
        for (slot, &word) in out[..words].iter_mut().zip(&self.out[..words]) {
            slot.write(word);
        }
        Some(self.count)
    }
}

/// A thread's last complete walks, [`MEMO_WAYS`] a set, the set chosen by their innermost
/// frame's address and the word holding its instruction. One last walk made every allocation
/// from another line or site than the one before walk afresh (~800 of the training steps'
/// 2,346 allocations); a training loop comes back to each site once a step, from the same
/// frames (CPython takes frames from a per-thread stack, so the same depth is the same
/// address). The set only chooses which walks to compare: a replay still compares every word
/// the walk read.
struct MemoTable {
    sets: Box<[MemoSet]>,
}

/// The walks of one [`MemoTable`] set. One walk a set missed whenever the same innermost
/// frame, at the same instruction, was reached from outer frames at other lines in turn (a
/// layer's forward called for each of a model's layers from one line, from two steps' lines):
/// ~150 of the training steps' 1,195 Python walks a pass walked afresh, 1,934 frames stepped
/// at ~140 instructions each.
struct MemoSet {
    ways: [LastWalk; MEMO_WAYS],
    /// The way the next fresh walk takes when every way holds a walk (first in, first out).
    next: u8,
}

/// Sets of a thread's [`MemoTable`], and walks a set (a walk's buffers grow as its frames
/// need: ~0.5 KiB for a walk of 8 frames).
const MEMO_SETS: usize = 128;
const MEMO_WAYS: usize = 4;
const _: () = assert!(MEMO_SETS.is_power_of_two());

impl MemoTable {
    fn new() -> MemoTable {
        MemoTable {
            sets: (0..MEMO_SETS)
                .map(|_| MemoSet {
                    ways: std::array::from_fn(|_| LastWalk {
                        valid: false,
                        frames: Vec::new(),
                        count: 0,
                        out: Vec::new(),
                        serial: 0,
                    }),
                    next: 0,
                })
                .collect(),
        }
    }

    /// The set of a walk from `frame` (non-null and aligned).
    fn set(&mut self, l: &Layout, frame: u64) -> &mut MemoSet {
        let instr = unsafe { word((frame + l.frame_instr as u64) & !7) };
        let mixed = (frame ^ instr.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let at = (mixed >> (64 - MEMO_SETS.trailing_zeros())) as usize;
        &mut self.sets[at % self.sets.len()]
    }
}

impl MemoSet {
    /// The way a fresh walk is remembered in: one holding no walk, else the oldest taken.
    fn victim(&mut self) -> &mut LastWalk {
        let at = match self.ways.iter().position(|way| !way.valid) {
            Some(at) => at,
            None => {
                let at = usize::from(self.next) % MEMO_WAYS;
                self.next = ((at + 1) % MEMO_WAYS) as u8;
                at
            }
        };
        &mut self.ways[at]
    }
}

thread_local! {
    /// This thread's last complete walks (allocated on first use, freed at thread exit).
    static MEMO: std::cell::Cell<*mut MemoTable> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// The set of this thread's [`MemoTable`] for a walk from `frame`, the table allocated the
/// first time (null if thread-local storage is gone, or `frame` is null or unaligned).
fn thread_memo(l: &Layout, frame: u64) -> *mut MemoSet {
    if frame == 0 || !frame.is_multiple_of(8) {
        return std::ptr::null_mut();
    }
    MEMO.try_with(|memo| {
        if memo.get().is_null() {
            memo.set(Box::into_raw(Box::new(MemoTable::new())));
        }
        // SAFETY: this thread's own, freed only at its exit; one walk at a time.
        let table = unsafe { &mut *memo.get() };
        table.set(l, frame) as *mut MemoSet
    })
    .unwrap_or(std::ptr::null_mut())
}

/// Frees this thread's last walks (at thread exit).
pub fn release_thread_memo() {
    let _ = MEMO.try_with(|memo| {
        let last = memo.replace(std::ptr::null_mut());
        if !last.is_null() {
            drop(unsafe { Box::from_raw(last) });
        }
    });
}

/// Guards against a code object's address being reused by another one.
fn identity(l: &Layout, code: u64) -> u64 {
    let (filename, name, first_line) = unsafe {
        (
            word(code + l.code_filename as u64),
            word(code + l.code_name as u64),
            int(code + l.code_firstlineno as u64) as u32,
        )
    };
    filename ^ name.rotate_left(32) ^ u64::from(first_line)
}

/// The log id of the code object a walk found (defining it the first time). Called while the
/// frame that holds the code object is still on this thread's stack.
pub fn code_id(code: u64, identity: u64) -> u32 {
    let Some(rt) = RUNTIME.get() else { return 0 };
    let mut codes = CODES.lock();
    let map = codes.get_or_insert_with(CodeMap::default);
    if let Some(&id) = map.get(&(code, identity)) {
        return id;
    }
    let id = NEXT_CODE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    map.insert((code, identity), id);
    let l = &rt.layout;
    let (filename, qualname, first_line, line_table) = unsafe {
        (
            read_str(l, word(code + l.code_filename as u64)),
            read_str(l, word(code + l.code_name as u64)),
            int(code + l.code_firstlineno as u64),
            read_bytes(word(code + l.code_linetable as u64)),
        )
    };
    writer::define(Record::Code(CodeDef {
        id,
        python: rt.version,
        filename,
        qualname,
        first_line: first_line.max(0) as u32,
        line_table,
    }));
    id
}

/// A compact `str` as UTF-8 (at most 4096 characters).
unsafe fn read_str(l: &Layout, object: u64) -> String {
    if object == 0 || !object.is_multiple_of(8) {
        return String::from("?");
    }
    let length = unsafe { word(object + UNICODE_LENGTH as u64) }.min(4096) as usize;
    let state = unsafe {
        (object as *const u8)
            .add(UNICODE_STATE)
            .cast::<u32>()
            .read()
    };
    // The same bits on 3.9 to 3.14 (non-free-threaded builds).
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact {
        return String::from("?");
    }
    let data = object
        + if ascii {
            l.unicode_ascii_data
        } else {
            l.unicode_compact_data
        } as u64;
    let char_at = |i: usize| -> u32 {
        unsafe {
            match kind {
                1 => u32::from(*(data as *const u8).add(i)),
                2 => u32::from(*(data as *const u16).add(i)),
                _ => *(data as *const u32).add(i),
            }
        }
    };
    if !matches!(kind, 1 | 2 | 4) {
        return String::from("?");
    }
    (0..length)
        .map(|i| char::from_u32(char_at(i)).unwrap_or('\u{fffd}'))
        .collect()
}

/// A `bytes` object's contents (at most 1 MiB).
unsafe fn read_bytes(object: u64) -> Vec<u8> {
    if object == 0 || !object.is_multiple_of(8) {
        return Vec::new();
    }
    let size = unsafe { word(object + BYTES_SIZE as u64) };
    if size > 1 << 20 {
        return Vec::new();
    }
    unsafe { std::slice::from_raw_parts((object + BYTES_DATA as u64) as *const u8, size as usize) }
        .to_vec()
}

/// Forgets defined code objects (fork child: its log defines them again); the parent's
/// table is leaked.
///
/// # Safety
/// Only in a fork child's after-fork handler.
pub unsafe fn reset_in_fork_child() {
    unsafe { CODES.reset_in_fork_child(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPython 3.13.0's `_Py_DebugOffsets` up to the unicode object's section, as the
    /// installed 3.13.0's `_PyRuntime` holds them.
    const DEBUG_OFFSETS_313: &[&[u64]] = &[
        &[283320, 608, 632],
        &[
            194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0, 7768, 7760,
        ],
        &[304, 0, 8, 16, 72, 152, 160, 232, 32],
        &[80, 8, 0, 56, 72, 70],
        &[208, 112, 120, 128, 136, 68, 52, 96, 104, 200],
        &[16, 8],
        &[416, 24, 88, 168],
        &[32, 24, 16],
        &[40, 24, 16],
        &[48, 32, 40],
        &[24, 16],
        &[32, 16, 24],
        &[40, 16, 32],
        &[64, 32, 16, 40],
    ];

    fn header(version: u64, free_threaded: u64) -> Vec<u64> {
        vec![u64::from_le_bytes(*b"xdebugpy"), version, free_threaded]
    }

    fn debug_offsets_313() -> Vec<u64> {
        let mut words = header(0x030d_00f0, 0);
        for section in DEBUG_OFFSETS_313 {
            words.extend_from_slice(section);
        }
        words
    }

    /// What scripts/py-offsets.sh prints for 3.13.0.
    const PY313: Layout = Layout {
        minor: 13,
        tstate_frame: 72,
        cframe_current: None,
        frame_code: 0,
        code_tag_bits: 0,
        frame_previous: 8,
        frame_instr: 56,
        instr: Instr::Pointer,
        frame_is_entry: None,
        frame_owner: Some(70),
        owner_generator: 1,
        owner_cstack: Some(3),
        code_filename: 112,
        code_name: 128,
        code_firstlineno: 68,
        code_linetable: 136,
        code_firsttraceable: Some(184),
        code_adaptive: 200,
        unicode_ascii_data: 40,
        unicode_compact_data: 56,
    };

    #[test]
    fn debug_offsets_of_313_give_the_layout_of_its_headers() {
        let words = debug_offsets_313();
        assert_eq!(words.len(), debug_words(DEBUG_SECTIONS_313));
        assert_eq!(layout_from_debug_offsets(13, &words), Ok(PY313));
    }

    #[test]
    fn debug_offsets_that_do_not_fit_are_refused() {
        let words = debug_offsets_313();
        let mut free_threaded = words.clone();
        free_threaded[2] = 1;
        assert_eq!(
            layout_from_debug_offsets(13, &free_threaded),
            Err("free-threaded CPython 3.13 (no frame layout for free-threaded builds)".into())
        );
        let mut cookie = words.clone();
        cookie[0] = 0;
        assert_eq!(
            layout_from_debug_offsets(13, &cookie),
            Err("CPython 3.13's _PyRuntime does not begin with _Py_DebugOffsets".into())
        );
        assert_eq!(
            layout_from_debug_offsets(13, &words[..40]),
            Err("CPython 3.13's _PyRuntime does not begin with _Py_DebugOffsets".into())
        );
        let mut version = words.clone();
        version[1] = 0x030c_01f0;
        assert_eq!(
            layout_from_debug_offsets(13, &version),
            Err("CPython 3.13's _Py_DebugOffsets are for version 0x30c01f0".into())
        );
        // 3.13's struct read with 3.14's sections: the sections do not line up.
        let mut as_314 = words.clone();
        as_314[1] = 0x030e_00f0;
        as_314.resize(debug_words(DEBUG_SECTIONS_314), 0);
        assert_eq!(
            layout_from_debug_offsets(14, &as_314),
            Err("CPython 3.14's _Py_DebugOffsets are not as expected (object header)".into())
        );
        // An offset outside its structure.
        let mut outside = words.clone();
        let frame_owner = DEBUG_HEADER_WORDS + 3 + 13 + 9 + 5;
        outside[frame_owner] = 80;
        assert_eq!(
            layout_from_debug_offsets(13, &outside),
            Err("CPython 3.13's _Py_DebugOffsets are not as expected (interpreter frame)".into())
        );
        assert_eq!(
            layout_from_debug_offsets(15, &words),
            Err("no frame layout for CPython 3.15 (supported: 3.9 to 3.14)".into())
        );
    }

    #[test]
    fn debug_offsets_of_314_shape_give_a_tagged_layout() {
        // 3.13's values in 3.14's sections; the fields 3.14 added (zeros here) are none of
        // those read.
        let mut words = header(0x030e_00f0, 0);
        let extra = |name: &str| match name {
            "interpreter_state" => 3,
            "interpreter_frame" => 2,
            "code_object" => 1,
            _ => 0,
        };
        let mut sections_313 = DEBUG_OFFSETS_313.iter();
        for &(name, size) in DEBUG_SECTIONS_314 {
            if name == "set_object" {
                words.extend_from_slice(&[200, 16, 40, 32]);
                continue;
            }
            let section = sections_313.next().expect("section");
            let mut values = section.to_vec();
            values.resize(section.len() + extra(name), 0);
            assert_eq!(values.len(), size, "{name}");
            words.extend(values);
        }
        let layout = layout_from_debug_offsets(14, &words).expect("layout");
        assert_eq!(
            layout,
            Layout {
                minor: 14,
                code_tag_bits: 7,
                code_firsttraceable: None,
                ..PY313
            }
        );
    }

    #[test]
    fn versions_parse_from_text() {
        assert_eq!(parse_version(b"3.10.13 (main, Jan  1 2024"), Some((3, 10)));
        assert_eq!(parse_version(b"3.9.18"), Some((3, 9)));
        assert_eq!(parse_version(b"3.14.0rc1 (tags"), Some((3, 14)));
        assert_eq!(parse_version(b"3.x"), None);
        assert_eq!(parse_version(b"3"), None);
        assert_eq!(parse_version(b""), None);
    }

    #[test]
    fn tables_differ_where_the_versions_do() {
        assert_eq!(
            PY310,
            Layout {
                minor: 10,
                frame_instr: 96,
                instr: Instr::LastiUnits,
                ..PY39
            }
        );
        assert_eq!(PY39.frame_instr, 104);
    }
}
