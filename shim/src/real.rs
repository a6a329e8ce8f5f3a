//! The real functions behind the shim's exports: glibc's `dlsym`, `RTLD_NEXT` look-ups, the
//! application's libcuda handle and the driver functions the shim itself calls. The bottom of
//! the entry-point side: it names no hook. Adopting a libcuda handle resolves the hook table's
//! real functions through the function registered with [`set_on_adopt`] at load.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Which library an entry point belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// libcuda: found through `dlsym` on the libcuda handle and the resolver.
    Driver,
    /// libcudart: found with `RTLD_NEXT`.
    Runtime,
}

pub(crate) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, found with `dlvsym` so that our own export is skipped.
pub(crate) static VRAMSHIM_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The libcuda handle the application uses (0 = not seen yet).
static LIBCUDA_HANDLE: AtomicUsize = AtomicUsize::new(0);

/// Finds glibc's `dlsym`. Called from the naked entry the first time, and from init.
pub(crate) extern "C" fn init_real_dlsym() -> *mut c_void {
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

/// What resolves the hook table's real driver functions from an adopted handle (`fn(handle)`),
/// registered at load (see `lifecycle`).
static ON_ADOPT: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Registers what resolves the hook table's driver functions when libcuda is adopted.
pub fn set_on_adopt(resolve: fn(*mut c_void)) {
    ON_ADOPT.store(resolve as *mut (), Ordering::Release);
}

/// Driver functions the shim itself calls (never hooked, resolved from the same handle).
pub struct DriverHelpers {
    pub ctx_get_device: AtomicPtr<c_void>,
    pub mem_get_info: AtomicPtr<c_void>,
    pub mem_get_address_range: AtomicPtr<c_void>,
    pub get_proc_address: AtomicPtr<c_void>,
    pub get_proc_address_v2: AtomicPtr<c_void>,
}

pub static DRIVER: DriverHelpers = DriverHelpers {
    ctx_get_device: AtomicPtr::new(std::ptr::null_mut()),
    mem_get_info: AtomicPtr::new(std::ptr::null_mut()),
    mem_get_address_range: AtomicPtr::new(std::ptr::null_mut()),
    get_proc_address: AtomicPtr::new(std::ptr::null_mut()),
    get_proc_address_v2: AtomicPtr::new(std::ptr::null_mut()),
};

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

/// Whether `handle` is a loaded `libcuda.so*` (the real driver or a compat copy).
pub fn is_libcuda(handle: *mut c_void) -> bool {
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
    // The hook table's real functions first (see `set_on_adopt`), then the shim's helpers.
    let on_adopt = ON_ADOPT.load(Ordering::Acquire);
    if on_adopt.is_null() {
        // Only from a constructor that ran before the shim's own: adopt it later.
        return;
    }
    let on_adopt: fn(*mut c_void) =
        unsafe { std::mem::transmute::<*mut (), fn(*mut c_void)>(on_adopt) };
    on_adopt(kept);
    let helpers = [
        (&DRIVER.ctx_get_device, c"cuCtxGetDevice"),
        (&DRIVER.mem_get_info, c"cuMemGetInfo_v2"),
        (&DRIVER.mem_get_address_range, c"cuMemGetAddressRange_v2"),
        (&DRIVER.get_proc_address, c"cuGetProcAddress"),
        (&DRIVER.get_proc_address_v2, c"cuGetProcAddress_v2"),
    ];
    for (slot, name) in helpers {
        slot.store(real_dlsym(kept, name), Ordering::Release);
    }
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
