//! The exported `dlsym`, the real `dlsym`, and the application's libcuda handle.
//!
//! Real cudart reaches the driver with `dlsym(libcuda_handle, "cuGetProcAddress_v2")`, and the
//! real libcuda is linked `-Bsymbolic`, so a preloaded `cuMemAlloc_v2` alone is never called by
//! it: the shim has to hand out its own functions from `dlsym`.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::table;

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, found with `dlvsym` so that our own export is skipped.
static VRAMSHIM_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The libcuda handle the application uses (0 = not seen yet).
static LIBCUDA_HANDLE: AtomicUsize = AtomicUsize::new(0);

/// Finds glibc's `dlsym`. Called from the naked entry the first time, and from init.
extern "C" fn init_real_dlsym() -> *mut c_void {
    let current = VRAMSHIM_REAL_DLSYM.load(Ordering::Acquire);
    if !current.is_null() {
        return current;
    }
    // dlsym@GLIBC_2.34 on current glibc, dlsym@GLIBC_2.2.5 before it.
    let mut found = std::ptr::null_mut();
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        found = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            break;
        }
    }
    VRAMSHIM_REAL_DLSYM.store(found, Ordering::Release);
    found
}

/// Exported `dlsym`. For `RTLD_NEXT` and `RTLD_DEFAULT` it *jumps* to glibc's `dlsym`, leaving
/// the caller's return address in place: glibc resolves `RTLD_NEXT` relative to the caller, so
/// an interposer loaded after the shim keeps finding the object after itself, not the shim.
/// Every other handle goes to [`dlsym_for_handle`].
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jnz 2f",
        // First call: find the real dlsym. Keep the arguments; align the stack for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {init}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "2:",
        "test rdi, rdi", // RTLD_DEFAULT
        "jz 3f",
        "cmp rdi, -1", // RTLD_NEXT
        "je 3f",
        "jmp {slow}",
        "3:",
        "jmp rax",
        "4:",
        "xor eax, eax",
        "ret",
        real = sym VRAMSHIM_REAL_DLSYM,
        init = sym init_real_dlsym,
        slow = sym dlsym_for_handle,
    )
}

/// Calls glibc's `dlsym` (from inside the shim: fine for real handles and for `RTLD_NEXT`
/// meaning "after the shim").
pub fn real_dlsym(handle: *mut c_void, symbol: &CStr) -> *mut c_void {
    let mut real = VRAMSHIM_REAL_DLSYM.load(Ordering::Acquire);
    if real.is_null() {
        real = init_real_dlsym();
    }
    if real.is_null() {
        return std::ptr::null_mut();
    }
    let real: DlsymFn = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(real) };
    unsafe { real(handle, symbol.as_ptr()) }
}

/// `dlsym` on a specific handle: the real answer, unless a libcuda handle asks for a function
/// the shim wraps.
unsafe extern "C" fn dlsym_for_handle(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let real = {
        let real = VRAMSHIM_REAL_DLSYM.load(Ordering::Acquire);
        let real: DlsymFn = unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(real) };
        unsafe { real(handle, symbol) }
    };
    if real.is_null() || symbol.is_null() {
        return real;
    }
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !name.starts_with(b"cu") {
        return real;
    }
    crate::guard(real, || {
        let Some(wrapper) = table::driver_wrapper_by_name(name) else {
            return real;
        };
        if !is_libcuda(handle) {
            return real;
        }
        adopt_libcuda(handle);
        crate::debug(format_args!(
            "dlsym({}) on libcuda -> shim wrapper",
            String::from_utf8_lossy(name)
        ));
        wrapper
    })
}

/// Whether `handle` is a loaded `libcuda.so*` (the real driver or a compat copy).
fn is_libcuda(handle: *mut c_void) -> bool {
    if handle.is_null() {
        return false;
    }
    let known = LIBCUDA_HANDLE.load(Ordering::Acquire);
    if known == handle as usize {
        return true;
    }
    let Some(path) = link_map_name(handle) else {
        return false;
    };
    let path = path.as_bytes();
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    base.starts_with(b"libcuda.so")
}

/// Remembers the application's libcuda and resolves the real driver functions from it.
/// The handle is published only once every real function is resolved: a thread that sees it
/// never finds a wrapper without its real function.
///
/// Real cudart `dlclose`s libcuda when `cuInit` fails; the shim keeps its own reference so
/// that the driver functions it holds never dangle.
pub fn adopt_libcuda(handle: *mut c_void) {
    if LIBCUDA_HANDLE.load(Ordering::Acquire) != 0 {
        return;
    }
    let _adopting = ADOPTING.lock();
    if LIBCUDA_HANDLE.load(Ordering::Acquire) != 0 {
        return;
    }
    let pinned = match link_map_name(handle) {
        Some(path) => unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) },
        None => std::ptr::null_mut(),
    };
    let kept = if pinned.is_null() { handle } else { pinned };
    table::resolve_driver(kept);
    LIBCUDA_HANDLE.store(kept as usize, Ordering::Release);
}

static ADOPTING: crate::sync::Lock<()> = crate::sync::Lock::new(());

/// In a fork child: frees the adoption lock, whoever held it in the parent.
///
/// # Safety
/// Only in a fork child's after-fork handler.
pub unsafe fn reset_in_fork_child() {
    unsafe { ADOPTING.reset_in_fork_child(()) };
}

/// The path a handle was loaded from.
fn link_map_name(handle: *mut c_void) -> Option<std::ffi::CString> {
    let mut map: *mut libc::c_void = std::ptr::null_mut();
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&raw mut map).cast::<c_void>(),
        )
    };
    if rc != 0 || map.is_null() {
        return None;
    }
    // struct link_map { ElfW(Addr) l_addr; char *l_name; ... }
    let name = unsafe { *(map as *const *const c_char).add(1) };
    if name.is_null() {
        return None;
    }
    Some(unsafe { CStr::from_ptr(name) }.to_owned())
}

/// The libcuda handle in use: the one the application looked symbols up in, or an already
/// loaded `libcuda.so.1` (programs linked with `-lcuda`). Never loads the driver itself.
pub fn libcuda() -> Option<*mut c_void> {
    let known = LIBCUDA_HANDLE.load(Ordering::Acquire);
    if known != 0 {
        return Some(known as *mut c_void);
    }
    let handle =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    adopt_libcuda(handle);
    Some(LIBCUDA_HANDLE.load(Ordering::Acquire) as *mut c_void)
}

/// `RTLD_NEXT` lookup of a libc or runtime function, from the shim's point of view.
pub fn next(symbol: &CStr) -> *mut c_void {
    real_dlsym(libc::RTLD_NEXT, symbol)
}
