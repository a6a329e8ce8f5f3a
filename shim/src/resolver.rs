//! Wrappers of the driver's resolver (`cuGetProcAddress*`) and of the runtime's
//! `cudaGetDriverEntryPoint*`: they call the real function and, when the pointer it returns is
//! an exported variant the shim wraps, hand out the wrapper bound to that exact variant. Every
//! other pointer passes through unchanged, so the resolver never invents a function the
//! installed driver lacks and ABI versions / per-thread-stream variants stay right.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::real::{self, DRIVER};
use crate::table;

type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;
type GetProcV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
type EntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_ulonglong, *mut c_int) -> c_int;
type EntryPointByVersion =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, c_ulonglong, *mut c_int) -> c_int;

const CUDA_ERROR_NOT_INITIALIZED: c_int = 3;
/// `cudaErrorSymbolNotFound`.
const CUDART_SYMBOL_NOT_FOUND: c_int = 500;

/// Replaces `*pfn` by the shim's function where one stands for it.
fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, via: &str) {
    if pfn.is_null() || symbol.is_null() {
        return;
    }
    let real = unsafe { *pfn };
    if real.is_null() {
        return;
    }
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    // The resolver's look-up of itself: later look-ups must come through us too.
    let replacement = if name == b"cuGetProcAddress" {
        let ours = if version >= 12000 {
            cuGetProcAddress_v2 as *mut c_void
        } else {
            cuGetProcAddress as *mut c_void
        };
        Some((
            if version >= 12000 {
                "cuGetProcAddress_v2"
            } else {
                "cuGetProcAddress"
            },
            ours,
        ))
    } else {
        table::driver_wrapper_by_real(real).map(|(def, wrapper)| (def.name, wrapper))
    };
    match replacement {
        Some((variant, wrapper)) => {
            unsafe { *pfn = wrapper };
            crate::debug(format_args!(
                "{via}({}, {version}, flags {flags}) -> shim wrapper of {variant}",
                String::from_utf8_lossy(name)
            ));
        }
        None => crate::debug(format_args!(
            "{via}({}, {version}, flags {flags}) -> passed through",
            String::from_utf8_lossy(name)
        )),
    }
}

fn real_of(slot: &AtomicPtr<c_void>) -> *mut c_void {
    let real = slot.load(Ordering::Acquire);
    if !real.is_null() {
        return real;
    }
    // Reached through an export (program linked with -lcuda): find the loaded driver.
    if real::libcuda().is_none() {
        return std::ptr::null_mut();
    }
    slot.load(Ordering::Acquire)
}

/// Wrapper of the v1 resolver `cuGetProcAddress(symbol, pfn, version, flags)`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> c_int {
    let real = real_of(&DRIVER.get_proc_address);
    if real.is_null() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    let real: GetProcV1 = unsafe { std::mem::transmute::<*mut c_void, GetProcV1>(real) };
    let rc = unsafe { real(symbol, pfn, version, flags) };
    if rc == 0 {
        crate::guard((), || {
            substitute(symbol, pfn, version, flags, "cuGetProcAddress")
        });
    }
    rc
}

/// Wrapper of the v2 resolver `cuGetProcAddress_v2(symbol, pfn, version, flags, status)`.
///
/// # Safety
/// Same contract as the driver's function.
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let real = real_of(&DRIVER.get_proc_address_v2);
    if real.is_null() {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    let real: GetProcV2 = unsafe { std::mem::transmute::<*mut c_void, GetProcV2>(real) };
    let rc = unsafe { real(symbol, pfn, version, flags, status) };
    if rc == 0 {
        crate::guard((), || {
            substitute(symbol, pfn, version, flags, "cuGetProcAddress_v2")
        });
    }
    rc
}

/// Wrapper of `cudaGetDriverEntryPoint(symbol, funcPtr, flags, driverStatus)`; PyTorch's
/// expandable segments obtain `cuMemCreate`, `cuMemMap`, ... this way.
///
/// # Safety
/// Same contract as the runtime's function.
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func: *mut *mut c_void,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let real = runtime_real(&REAL, c"cudaGetDriverEntryPoint");
    if real.is_null() {
        return CUDART_SYMBOL_NOT_FOUND;
    }
    let real: EntryPoint = unsafe { std::mem::transmute::<*mut c_void, EntryPoint>(real) };
    let rc = unsafe { real(symbol, func, flags, status) };
    if rc == 0 {
        // The runtime may have looked the symbol up without our resolver (static cudart
        // built before the shim saw libcuda): make sure the driver functions are known.
        crate::guard((), || {
            let _ = real::libcuda();
            substitute(symbol, func, 0, flags, "cudaGetDriverEntryPoint")
        });
    }
    rc
}

/// Wrapper of `cudaGetDriverEntryPointByVersion(symbol, funcPtr, version, flags, status)`.
///
/// # Safety
/// Same contract as the runtime's function.
#[unsafe(no_mangle)]
#[allow(non_snake_case)]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: c_ulonglong,
    status: *mut c_int,
) -> c_int {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let real = runtime_real(&REAL, c"cudaGetDriverEntryPointByVersion");
    if real.is_null() {
        return CUDART_SYMBOL_NOT_FOUND;
    }
    let real: EntryPointByVersion =
        unsafe { std::mem::transmute::<*mut c_void, EntryPointByVersion>(real) };
    let rc = unsafe { real(symbol, func, version, flags, status) };
    if rc == 0 {
        crate::guard((), || {
            let _ = real::libcuda();
            substitute(
                symbol,
                func,
                version as c_int,
                flags,
                "cudaGetDriverEntryPointByVersion",
            )
        });
    }
    rc
}

fn runtime_real(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let real = slot.load(Ordering::Acquire);
    if !real.is_null() {
        return real;
    }
    let found = real::next(name);
    slot.store(found, Ordering::Release);
    found
}
