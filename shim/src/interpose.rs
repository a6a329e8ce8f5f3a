//! The exported `dlsym`: a libcuda handle asked for a function the shim wraps gets the wrapper
//! (the real look-ups live in `real`).
//!
//! Real cudart reaches the driver with `dlsym(libcuda_handle, "cuGetProcAddress_v2")`, and the
//! real libcuda is linked `-Bsymbolic`, so a preloaded `cuMemAlloc_v2` alone is never called by
//! it: the shim has to hand out its own functions from `dlsym`.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::Ordering;

use crate::real::{self, DlsymFn, VRAMSHIM_REAL_DLSYM, adopt_libcuda, is_libcuda};
use crate::{resolver, table};

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
        init = sym real::init_real_dlsym,
        slow = sym dlsym_for_handle,
    )
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
        let resolver_wrapper = match name {
            b"cuGetProcAddress" => Some(resolver::cuGetProcAddress as *mut c_void),
            b"cuGetProcAddress_v2" => Some(resolver::cuGetProcAddress_v2 as *mut c_void),
            _ => None,
        };
        let Some(wrapper) = resolver_wrapper.or_else(|| table::driver_wrapper_by_name(name)) else {
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
