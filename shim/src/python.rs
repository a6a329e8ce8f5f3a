//! Python call stacks, read raw from the calling thread's own interpreter frames.
//!
//! PyTorch releases the GIL before it allocates, so the hook cannot use the C API. It reads
//! the thread's frame chain directly instead: while the hook runs the chain is frozen (this
//! thread is executing the hook) and every code object on it is kept alive by its frame. No
//! GIL, no Python lock, no Python code, no allocation (except the first time a code object is
//! seen, when its definition is written to the log).
//!
//! Struct offsets come from a table per minor version (derived from the interpreter's own
//! headers by `scripts/py-offsets.sh`) and are checked once against the running interpreter:
//! the first frame read must point at objects of the code, str and bytes types, read through
//! fault-proof system calls. Any mismatch, or a version without a table, turns Python capture
//! off for the process with one note in the log; native stacks go on.

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use vramshim_format::{CodeDef, Note, Record};

use crate::{interpose, writer};

/// Most Python frames kept per stack.
pub const MAX_PY_FRAMES: usize = 256;
/// Words of a stack key per Python frame: code address, identity check, offset and entry bit.
pub const WORDS_PER_FRAME: usize = 3;
/// Marks the last word of a stack key that holds Python frames (low 32 bits: their count).
/// No native return address has these top bits.
pub const PY_KEY_TAG: u64 = 0xfffe_0000_0000_0000;

/// Offsets into the interpreter's structures for one minor version (non-debug builds, where
/// `ob_type` is at 8).
#[derive(Clone, Copy, Debug)]
struct Layout {
    minor: u8,
    tstate_cframe: usize,
    cframe_current: usize,
    frame_code: usize,
    frame_previous: usize,
    frame_instr: usize,
    /// 3.11: `is_entry`; 3.12 marks entries with a C-stack-owned frame instead.
    frame_is_entry: Option<usize>,
    frame_owner: usize,
    owner_generator: u8,
    /// 3.12: `FRAME_OWNED_BY_CSTACK`, the shim frame each eval-loop call pushes.
    owner_cstack: Option<u8>,
    code_filename: usize,
    code_qualname: usize,
    code_firstlineno: usize,
    code_linetable: usize,
    code_firsttraceable: usize,
    code_adaptive: usize,
    unicode_ascii_data: usize,
    unicode_compact_data: usize,
}

const OB_TYPE: usize = 8;
const UNICODE_LENGTH: usize = 16;
const UNICODE_STATE: usize = 32;
const BYTES_SIZE: usize = 16;
const BYTES_DATA: usize = 32;

/// CPython 3.11 (scripts/py-offsets.sh on 3.11.7).
const PY311: Layout = Layout {
    minor: 11,
    tstate_cframe: 56,
    cframe_current: 8,
    frame_code: 32,
    frame_previous: 48,
    frame_instr: 56,
    frame_is_entry: Some(68),
    frame_owner: 69,
    owner_generator: 1,
    owner_cstack: None,
    code_filename: 112,
    code_qualname: 128,
    code_firstlineno: 72,
    code_linetable: 136,
    code_firsttraceable: 168,
    code_adaptive: 184,
    unicode_ascii_data: 48,
    unicode_compact_data: 72,
};

/// CPython 3.12 (scripts/py-offsets.sh on 3.12.1).
const PY312: Layout = Layout {
    minor: 12,
    tstate_cframe: 56,
    cframe_current: 0,
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    frame_is_entry: None,
    frame_owner: 70,
    owner_generator: 1,
    owner_cstack: Some(3),
    code_filename: 112,
    code_qualname: 128,
    code_firstlineno: 68,
    code_linetable: 136,
    code_firsttraceable: 176,
    code_adaptive: 192,
    unicode_ascii_data: 40,
    unicode_compact_data: 56,
};

struct Runtime {
    layout: Layout,
    /// `major << 8 | minor`.
    version: u16,
    get_tstate: unsafe extern "C" fn() -> *mut c_void,
    code_type: u64,
    unicode_type: u64,
    bytes_type: u64,
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
static CODES: Mutex<Option<HashMap<(u64, u64), u32>>> = Mutex::new(None);
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
    interpose::real_dlsym(libc::RTLD_DEFAULT, name)
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
    let version = symbol(c"Py_Version");
    if version.is_null() {
        give_up("CPython older than 3.11 (supported: 3.11, 3.12)");
        return false;
    }
    // `Py_Version` is PY_VERSION_HEX: 0xMMmmPPRS.
    let hex = unsafe { (version as *const u32).read() };
    let (major, minor) = ((hex >> 24) as u8, (hex >> 16) as u8);
    let table = match (major, minor) {
        (3, 11) => PY311,
        (3, 12) => PY312,
        _ => {
            give_up(&format!(
                "no frame layout for CPython {major}.{minor} (supported: 3.11, 3.12)"
            ));
            return false;
        }
    };
    let mut layout = table;
    if std::env::var_os("VRAMSHIM_TEST_PY_LAYOUT_BREAK").is_some_and(|v| v == "1") {
        // Test hook: a wrong offset must be caught by the check, never followed.
        layout.frame_code += 8;
    }
    let get_tstate = symbol(c"PyGILState_GetThisThreadState");
    let types = [c"PyCode_Type", c"PyUnicode_Type", c"PyBytes_Type"].map(symbol);
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
    };
    let _ = RUNTIME.set(runtime);
    STATE.store(UNVERIFIED, Ordering::Release);
    crate::debug(format_args!("python {major}.{minor} found"));
    true
}

/// Reads 8 bytes at `addr` without ever faulting (for the one-time layout check).
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

/// Checks the layout on the first live frame: its code object, and the code object's file
/// name, qualified name and line table must have the expected types.
fn verify(rt: &Runtime, frame: u64) -> bool {
    let l = &rt.layout;
    let check = || -> Option<()> {
        let code = checked_read(frame + l.frame_code as u64)?;
        (checked_read(code + OB_TYPE as u64)? == rt.code_type).then_some(())?;
        for (field, ty) in [
            (l.code_filename, rt.unicode_type),
            (l.code_qualname, rt.unicode_type),
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

/// Writes the calling thread's Python frames (innermost first) into `out` as
/// [`WORDS_PER_FRAME`] words each; returns how many frames. 0 when the thread runs no Python
/// code or Python capture is off.
pub fn walk(out: &mut [u64]) -> usize {
    let mut state = STATE.load(Ordering::Acquire);
    if state == UNKNOWN {
        probe();
        state = STATE.load(Ordering::Acquire);
    }
    if state != ON && state != UNVERIFIED {
        return 0;
    }
    let Some(rt) = RUNTIME.get() else { return 0 };
    let l = &rt.layout;
    let tstate = unsafe { (rt.get_tstate)() } as u64;
    if tstate == 0 || !tstate.is_multiple_of(8) {
        return 0;
    }
    let cframe = unsafe { word(tstate + l.tstate_cframe as u64) };
    if cframe == 0 || !cframe.is_multiple_of(8) {
        return 0;
    }
    let mut frame = unsafe { word(cframe + l.cframe_current as u64) };
    if state == UNVERIFIED {
        // Skip C-stack shim frames to reach a real one.
        let mut first = frame;
        while let Some(cstack) = l.owner_cstack {
            if first == 0 || !first.is_multiple_of(8) {
                break;
            }
            let at = first + l.frame_owner as u64;
            let owner = checked_read(at & !7).map(|w| (w >> ((at & 7) * 8)) as u8);
            if owner != Some(cstack) {
                break;
            }
            first = checked_read(first + l.frame_previous as u64).unwrap_or(0);
        }
        if first == 0 {
            return 0;
        }
        if !verify(rt, first) {
            give_up(&format!(
                "the frame layout of CPython 3.{} does not match the running interpreter",
                l.minor
            ));
            return 0;
        }
        let _ = STATE.compare_exchange(UNVERIFIED, ON, Ordering::AcqRel, Ordering::Acquire);
    }
    let max = (out.len() / WORDS_PER_FRAME).min(MAX_PY_FRAMES);
    let mut count = 0usize;
    let mut steps = 0usize;
    while frame != 0 && count < max && steps < 4 * MAX_PY_FRAMES {
        steps += 1;
        if !frame.is_multiple_of(8) {
            break;
        }
        let owner = unsafe { byte(frame + l.frame_owner as u64) };
        let previous = unsafe { word(frame + l.frame_previous as u64) };
        if Some(owner) == l.owner_cstack {
            // The eval loop's entry marker: the frame above it began a native eval call.
            if count > 0 {
                out[(count - 1) * WORDS_PER_FRAME + 2] |= 1;
            }
            frame = previous;
            continue;
        }
        let code = unsafe { word(frame + l.frame_code as u64) };
        if code == 0
            || !code.is_multiple_of(8)
            || unsafe { word(code + OB_TYPE as u64) } != rt.code_type
        {
            break;
        }
        let entry = l
            .frame_is_entry
            .is_some_and(|at| unsafe { byte(frame + at as u64) } != 0);
        let instr = unsafe { word(frame + l.frame_instr as u64) };
        let start = code + l.code_adaptive as u64;
        let first_traceable = unsafe {
            (code as *const u8)
                .add(l.code_firsttraceable)
                .cast::<i32>()
                .read()
        };
        let incomplete = owner != l.owner_generator
            && (instr < start || instr < start + 2 * u64::from(first_traceable.max(0) as u32));
        if incomplete {
            // Not started yet (the interpreter hides these too); keep the group boundary.
            if entry && count > 0 {
                out[(count - 1) * WORDS_PER_FRAME + 2] |= 1;
            }
            frame = previous;
            continue;
        }
        let offset = (instr - start) / 2;
        let at = count * WORDS_PER_FRAME;
        out[at] = code;
        out[at + 1] = identity(l, code);
        out[at + 2] = (offset.min(u64::from(u32::MAX)) << 1) | u64::from(entry);
        count += 1;
        frame = previous;
    }
    if count > 0 {
        // The outermost frame always ends a group.
        out[(count - 1) * WORDS_PER_FRAME + 2] |= 1;
    }
    count
}

/// Guards against a code object's address being reused by another one.
fn identity(l: &Layout, code: u64) -> u64 {
    let (filename, qualname, first_line) = unsafe {
        (
            word(code + l.code_filename as u64),
            word(code + l.code_qualname as u64),
            (code as *const u8)
                .add(l.code_firstlineno)
                .cast::<i32>()
                .read() as u32,
        )
    };
    filename ^ qualname.rotate_left(32) ^ u64::from(first_line)
}

/// The log id of the code object a walk found (defining it the first time). Called while the
/// frame that holds the code object is still on this thread's stack.
pub fn code_id(code: u64, identity: u64) -> u32 {
    let Some(rt) = RUNTIME.get() else { return 0 };
    let mut codes = CODES.lock();
    let map = codes.get_or_insert_with(HashMap::new);
    if let Some(&id) = map.get(&(code, identity)) {
        return id;
    }
    let id = NEXT_CODE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    map.insert((code, identity), id);
    let l = &rt.layout;
    let (filename, qualname, first_line, line_table) = unsafe {
        (
            read_str(l, word(code + l.code_filename as u64)),
            read_str(l, word(code + l.code_qualname as u64)),
            (code as *const u8)
                .add(l.code_firstlineno)
                .cast::<i32>()
                .read(),
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

/// Forgets defined code objects (fork child: its log defines them again).
pub fn reset_after_fork() {
    *CODES.lock() = None;
}

pub fn lock_all() {
    std::mem::forget(CODES.lock());
}

/// # Safety
/// Only after [`lock_all`], on the thread that called it (or its fork child).
pub unsafe fn unlock_all() {
    unsafe { CODES.force_unlock() };
}
