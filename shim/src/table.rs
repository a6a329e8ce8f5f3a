//! The hook table: every intercepted entry point that obtains or releases memory, declared
//! once. From each line the `hooks!` macro generates the exported wrapper, the slot holding
//! the real function, and the entry used by `dlsym` and the resolver to hand out wrappers.
//!
//! A line reads: `layer fn name(args) => |result| spec;` where `spec` says what the call did
//! (see [`Spec`]); it runs after the real call, so it may read out-parameters.

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use vramshim_format::EventKind;

use crate::capture::{self, Spec};
use crate::real::{self, Layer};
use crate::{imported_pointers, stream_capture, torch_report, torch_trace};

/// One row of the table.
pub struct HookDef {
    pub name: &'static str,
    pub cname: &'static CStr,
    pub layer: Layer,
    /// The shim's exported wrapper.
    pub wrapper: *const c_void,
}

// The table only holds pointers to functions, which are immutable.
unsafe impl Sync for HookDef {}

type CuDevicePtr = u64;
type Stream = *mut c_void;
const CUDA_ERROR_NOT_INITIALIZED: c_int = 3;
/// `cudaErrorSymbolNotFound`: the runtime entry point does not exist in this process.
const CUDA_RT_ERROR_SYMBOL_NOT_FOUND: c_int = 500;

macro_rules! hooks {
    ($( $layer:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $(watch $($watch:ident)::+ ( $($warg:expr),* ),)? |$res:ident| $spec:expr; )*) => {
        /// Index of each hook in [`HOOKS`]; also the `api` number in the log.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u16)]
        pub enum Hook { $($name),* }

        /// Number of hooks.
        pub const HOOK_COUNT: usize = [$(stringify!($name)),*].len();

        /// The table, in [`Hook`] order.
        pub static HOOKS: [HookDef; HOOK_COUNT] = [$(
            HookDef {
                name: stringify!($name),
                cname: match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(name) => name,
                    Err(_) => panic!("hook name with NUL"),
                },
                layer: Layer::$layer,
                wrapper: $name as *const c_void,
            }
        ),*];

        $(
            #[doc = concat!("Recording wrapper of `", stringify!($name), "`.")]
            ///
            /// # Safety
            /// Same contract as the wrapped CUDA function.
            #[unsafe(no_mangle)]
            #[allow(non_snake_case)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
                type Real = unsafe extern "C" fn($($ty),*) -> c_int;
                let real = real_function(Hook::$name);
                if real.is_null() {
                    return missing_real(Layer::$layer);
                }
                let real: Real = unsafe { std::mem::transmute::<*mut c_void, Real>(real) };
                // A watched call (stream capture begin/end, PyTorch 2.1's unmaps): its state
                // around the real call, kept whether or not the call is recorded.
                $( let watched = $($watch)::+::before($($warg),*); )?
                let result = capture::hook(
                    Hook::$name as u16,
                    Layer::$layer,
                    || unsafe { real($($arg),*) },
                    #[allow(unused_variables)]
                    |$res: c_int| -> Option<Spec> { $spec },
                );
                $( $($watch)::+::after(watched, result); )?
                result
            }
        )*
    };
}

hooks! {
    // Driver: synchronous device memory.
    Driver fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytesize: usize) =>
        |r| Some(Spec::new(EventKind::Alloc, out(r, dptr), bytesize as u64));
    Driver fn cuMemAllocPitch_v2(dptr: *mut CuDevicePtr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, out(r, dptr), pitched(r, pitch, width, height)));
    Driver fn cuMemAllocManaged(dptr: *mut CuDevicePtr, bytesize: usize, flags: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, out(r, dptr), bytesize as u64));
    Driver fn cuMemFree_v2(dptr: CuDevicePtr) =>
        |r| (dptr != 0).then(|| freed(r, EventKind::Free, dptr));
    // Driver: pinned host memory.
    Driver fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) =>
        |r| Some(Spec::new(EventKind::Alloc, out_ptr(r, pp), bytesize as u64).host());
    Driver fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, out_ptr(r, pp), bytesize as u64).host());
    Driver fn cuMemFreeHost(p: *mut c_void) =>
        |r| (!p.is_null()).then(|| Spec::new(EventKind::Free, p as u64, 0).host());
    Driver fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, p as u64, bytesize as u64).host());
    Driver fn cuMemHostUnregister(p: *mut c_void) =>
        |r| Some(Spec::new(EventKind::Free, p as u64, 0).host());
    // Driver: stream-ordered allocation (each also as the per-thread-default-stream variant).
    Driver fn cuMemAllocAsync(dptr: *mut CuDevicePtr, bytesize: usize, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, false), out(r, dptr), bytesize as u64).stream(stream));
    Driver fn cuMemAllocAsync_ptsz(dptr: *mut CuDevicePtr, bytesize: usize, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, true), out(r, dptr), bytesize as u64).stream(stream));
    Driver fn cuMemAllocFromPoolAsync(dptr: *mut CuDevicePtr, bytesize: usize, pool: *mut c_void, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, false), out(r, dptr), bytesize as u64).stream(stream).handle(pool as u64));
    Driver fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CuDevicePtr, bytesize: usize, pool: *mut c_void, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, true), out(r, dptr), bytesize as u64).stream(stream).handle(pool as u64));
    Driver fn cuMemFreeAsync(dptr: CuDevicePtr, stream: Stream) =>
        |r| Some(freed(r, stream_ordered(r, EventKind::Free, stream, false), dptr).stream(stream));
    Driver fn cuMemFreeAsync_ptsz(dptr: CuDevicePtr, stream: Stream) =>
        |r| Some(freed(r, stream_ordered(r, EventKind::Free, stream, true), dptr).stream(stream));
    Driver fn cuMemPoolTrimTo(pool: *mut c_void, min_bytes_to_keep: usize) =>
        |r| Some(Spec::new(EventKind::Trim, 0, min_bytes_to_keep as u64).handle(pool as u64));
    // Driver: virtual memory management.
    Driver fn cuMemAddressReserve(ptr: *mut CuDevicePtr, size: usize, alignment: usize, addr: CuDevicePtr, flags: u64) =>
        |r| Some(Spec::new(EventKind::Reserve, out(r, ptr), size as u64));
    Driver fn cuMemAddressFree(ptr: CuDevicePtr, size: usize) =>
        |r| Some(Spec::new(EventKind::Unreserve, ptr, size as u64));
    Driver fn cuMemCreate(handle: *mut u64, size: usize, prop: *const c_void, flags: u64) =>
        |r| Some(Spec::new(EventKind::Create, 0, size as u64).handle(out(r, handle)).device_opt(prop_device(prop)));
    Driver fn cuMemRelease(handle: u64) =>
        |r| Some(Spec::new(EventKind::Release, 0, 0).handle(handle));
    Driver fn cuMemMap(ptr: CuDevicePtr, size: usize, offset: usize, handle: u64, flags: u64) =>
        |r| {
            torch_trace::after_mem_map(HOOK_COUNT as u16, r, ptr, size as u64);
            Some(Spec::new(EventKind::Map, ptr, size as u64).handle(handle))
        };
    // Under expandable segments PyTorch's segment releases are unmaps (one per page, each
    // followed by its cuMemRelease): the unmap keeps the stack that tells a retry apart.
    // With PyTorch 2.1's profiler report, an unmap inside one of its ranges is its segment_unmap.
    Driver fn cuMemUnmap(ptr: CuDevicePtr, size: usize) =>
        watch torch_report::Unmap(ptr, size),
        |r| Some(Spec::new(EventKind::Unmap, ptr, size as u64).segment_release());
    // Driver: arrays (opaque handles, no device address).
    Driver fn cuArrayCreate_v2(array: *mut *mut c_void, desc: *const ArrayDescriptor) =>
        |r| Some(Spec::new(EventKind::Alloc, 0, array_bytes(desc)).handle(out_ptr(r, array)));
    Driver fn cuArray3DCreate_v2(array: *mut *mut c_void, desc: *const Array3dDescriptor) =>
        |r| Some(Spec::new(EventKind::Alloc, 0, array3d_bytes(desc, 1)).handle(out_ptr(r, array)));
    Driver fn cuArrayDestroy(array: *mut c_void) =>
        |r| Some(Spec::new(EventKind::Free, 0, 0).handle(array as u64));
    Driver fn cuMipmappedArrayCreate(array: *mut *mut c_void, desc: *const Array3dDescriptor, levels: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, 0, array3d_bytes(desc, levels)).handle(out_ptr(r, array)));
    Driver fn cuMipmappedArrayDestroy(array: *mut c_void) =>
        |r| Some(Spec::new(EventKind::Free, 0, 0).handle(array as u64));
    // Driver: IPC. An opened handle maps another process's memory here: a mapping that takes
    // no memory of this process (the memory stays the exporter's), recorded as one.
    Driver fn cuIpcOpenMemHandle_v2(dptr: *mut CuDevicePtr, handle: IpcMemHandle, flags: c_uint) =>
        |r| ipc_opened(r, out(r, dptr));
    Driver fn cuIpcOpenMemHandle(dptr: *mut CuDevicePtr, handle: IpcMemHandle, flags: c_uint) =>
        |r| ipc_opened(r, out(r, dptr));
    Driver fn cuIpcCloseMemHandle(dptr: CuDevicePtr) =>
        |r| (r == 0).then(|| Spec::new(EventKind::Unmap, dptr, 0));
    // Another process's pool allocation imported into a pool imported from that process: a
    // mapping, as an IPC open; the free that gives it back is its unmapping.
    Driver fn cuMemPoolImportPointer(dptr: *mut CuDevicePtr, pool: *mut c_void, data: *mut c_void) =>
        |r| pool_pointer_imported(r, out(r, dptr), pool);

    // Runtime (dynamic libcudart): one event per call; the driver calls inside are not recorded.
    Runtime fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) =>
        |r| {
            let addr = out_ptr(r, dev_ptr);
            torch_trace::after_cuda_malloc(HOOK_COUNT as u16, r, addr, size as u64);
            Some(Spec::new(EventKind::Alloc, addr, size as u64))
        };
    Runtime fn cudaFree(dev_ptr: *mut c_void) =>
        // cudaFree(NULL) is the idiom for "create the context": no memory involved.
        |r| {
            torch_report::after_cuda_free(r, dev_ptr as u64);
            (!dev_ptr.is_null()).then(|| freed(r, EventKind::Free, dev_ptr as u64).segment_release())
        };
    Runtime fn cudaMallocAsync(dev_ptr: *mut *mut c_void, size: usize, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, false), out_ptr(r, dev_ptr), size as u64).stream(stream));
    Runtime fn cudaMallocAsync_ptsz(dev_ptr: *mut *mut c_void, size: usize, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, true), out_ptr(r, dev_ptr), size as u64).stream(stream));
    Runtime fn cudaFreeAsync(dev_ptr: *mut c_void, stream: Stream) =>
        |r| (!dev_ptr.is_null()).then(|| freed(r, stream_ordered(r, EventKind::Free, stream, false), dev_ptr as u64).stream(stream));
    Runtime fn cudaFreeAsync_ptsz(dev_ptr: *mut c_void, stream: Stream) =>
        |r| (!dev_ptr.is_null()).then(|| freed(r, stream_ordered(r, EventKind::Free, stream, true), dev_ptr as u64).stream(stream));
    Runtime fn cudaMallocFromPoolAsync(dev_ptr: *mut *mut c_void, size: usize, pool: *mut c_void, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, false), out_ptr(r, dev_ptr), size as u64).stream(stream).handle(pool as u64));
    Runtime fn cudaMallocFromPoolAsync_ptsz(dev_ptr: *mut *mut c_void, size: usize, pool: *mut c_void, stream: Stream) =>
        |r| Some(Spec::new(stream_ordered(r, EventKind::Alloc, stream, true), out_ptr(r, dev_ptr), size as u64).stream(stream).handle(pool as u64));
    Runtime fn cudaMallocManaged(dev_ptr: *mut *mut c_void, size: usize, flags: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, out_ptr(r, dev_ptr), size as u64));
    Runtime fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) =>
        |r| Some(Spec::new(EventKind::Alloc, out_ptr(r, ptr), size as u64).host());
    Runtime fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) =>
        |r| Some(Spec::new(EventKind::Alloc, out_ptr(r, ptr), size as u64).host());
    Runtime fn cudaFreeHost(ptr: *mut c_void) =>
        |r| (!ptr.is_null()).then(|| Spec::new(EventKind::Free, ptr as u64, 0).host());
    Runtime fn cudaMallocPitch(dev_ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) =>
        |r| Some(Spec::new(EventKind::Alloc, out_ptr(r, dev_ptr), pitched(r, pitch, width, height)));
    Runtime fn cudaMemPoolTrimTo(pool: *mut c_void, min_bytes_to_keep: usize) =>
        |r| Some(Spec::new(EventKind::Trim, 0, min_bytes_to_keep as u64).handle(pool as u64));
    Runtime fn cudaIpcOpenMemHandle(dev_ptr: *mut *mut c_void, handle: IpcMemHandle, flags: c_uint) =>
        |r| ipc_opened(r, out_ptr(r, dev_ptr));
    Runtime fn cudaIpcCloseMemHandle(dev_ptr: *mut c_void) =>
        |r| (r == 0).then(|| Spec::new(EventKind::Unmap, dev_ptr as u64, 0));
    Runtime fn cudaMemPoolImportPointer(dev_ptr: *mut *mut c_void, pool: *mut c_void, data: *mut c_void) =>
        |r| pool_pointer_imported(r, out_ptr(r, dev_ptr), pool);

    // Graphs: the driver takes a graph's memory from the device's graph pool at launch (or
    // upload) and gives it back at trim; each records the pool's level when it changed.
    Driver fn cuGraphLaunch(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Driver, None, stream);
    Driver fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Driver, None, stream);
    Driver fn cuGraphUpload(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Driver, None, stream);
    Driver fn cuGraphUpload_ptsz(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Driver, None, stream);
    Driver fn cuDeviceGraphMemTrim(device: c_int) =>
        |r| graph_pool(Layer::Driver, Some(device), std::ptr::null_mut());
    Runtime fn cudaGraphLaunch(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Runtime, None, stream);
    Runtime fn cudaGraphLaunch_ptsz(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Runtime, None, stream);
    Runtime fn cudaGraphUpload(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Runtime, None, stream);
    Runtime fn cudaGraphUpload_ptsz(exec: *mut c_void, stream: Stream) =>
        |r| graph_pool(Layer::Runtime, None, stream);
    Runtime fn cudaDeviceGraphMemTrim(device: c_int) =>
        |r| graph_pool(Layer::Runtime, Some(device), std::ptr::null_mut());
    // A graph exec destroyed: the driver keeps the pool until a trim, but if it gave any
    // back the level says so.
    Driver fn cuGraphExecDestroy(exec: *mut c_void) =>
        |r| graph_pool(Layer::Driver, None, std::ptr::null_mut());
    Runtime fn cudaGraphExecDestroy(exec: *mut c_void) =>
        |r| graph_pool(Layer::Runtime, None, std::ptr::null_mut());
    // Memory nodes added by hand: nodes as a capture makes them (no memory until a launch).
    Driver fn cuGraphAddMemAllocNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, count: usize, params: *const c_void) =>
        |r| memory_node_added(r, graph, params);
    Driver fn cuGraphAddMemFreeNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, count: usize, dptr: CuDevicePtr) =>
        |r| (r == 0).then(|| Spec::new(EventKind::GraphFree, dptr, 0).handle(graph as u64));
    // The generic adder (the runtime's cudaGraphAddNode calls it, whose signature differs
    // between CUDA 12 and 13): its memory nodes.
    Driver fn cuGraphAddNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, count: usize, params: *const c_void) =>
        |r| generic_node_added(r, graph, params);
    Driver fn cuGraphAddNode_v2(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, params: *const c_void) =>
        |r| generic_node_added(r, graph, params);
    Runtime fn cudaGraphAddMemAllocNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, count: usize, params: *const c_void) =>
        |r| memory_node_added(r, graph, params);
    Runtime fn cudaGraphAddMemFreeNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, count: usize, dptr: *mut c_void) =>
        |r| (r == 0).then(|| Spec::new(EventKind::GraphFree, dptr as u64, 0).handle(graph as u64));

    // Stream captures: counted, so that a stream-ordered call asks the driver about its stream
    // only while one is in progress (`stream_capture`). Every way to begin one, and the ends.
    Driver fn cuStreamBeginCapture(stream: Stream) =>
        watch stream_capture::Begin(stream), |r| None;
    Driver fn cuStreamBeginCapture_ptsz(stream: Stream) =>
        watch stream_capture::Begin(stream), |r| None;
    Driver fn cuStreamBeginCapture_v2(stream: Stream, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Driver fn cuStreamBeginCapture_v2_ptsz(stream: Stream, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Driver fn cuStreamBeginCaptureToGraph(stream: Stream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Driver fn cuStreamBeginCaptureToGraph_ptsz(stream: Stream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Driver fn cuStreamEndCapture(stream: Stream, graph: *mut *mut c_void) =>
        watch stream_capture::End(stream, false), |r| None;
    Driver fn cuStreamEndCapture_ptsz(stream: Stream, graph: *mut *mut c_void) =>
        watch stream_capture::End(stream, true), |r| None;
    Runtime fn cudaStreamBeginCapture(stream: Stream, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Runtime fn cudaStreamBeginCapture_ptsz(stream: Stream, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Runtime fn cudaStreamBeginCaptureToGraph(stream: Stream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Runtime fn cudaStreamBeginCaptureToGraph_ptsz(stream: Stream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, count: usize, mode: c_int) =>
        watch stream_capture::Begin(stream), |r| None;
    Runtime fn cudaStreamEndCapture(stream: Stream, graph: *mut *mut c_void) =>
        watch stream_capture::End(stream, false), |r| None;
    Runtime fn cudaStreamEndCapture_ptsz(stream: Stream, graph: *mut *mut c_void) =>
        watch stream_capture::End(stream, true), |r| None;
}

/// `CUipcMemHandle` / `cudaIpcMemHandle_t`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    reserved: [u8; 64],
}

/// The mapping an IPC open made at `addr`: its size from the driver (the handle is opaque);
/// nothing when the open failed.
fn ipc_opened(result: c_int, addr: u64) -> Option<Spec> {
    if result != 0 || addr == 0 {
        return None;
    }
    let _ = real::libcuda();
    let range = real::DRIVER.mem_get_address_range.load(Ordering::Acquire);
    let mut size = 0usize;
    if !range.is_null() {
        let range: unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> c_int =
            unsafe { std::mem::transmute::<*mut c_void, _>(range) };
        let mut base: CuDevicePtr = 0;
        if unsafe { range(&mut base, &mut size, addr) } != 0 {
            size = 0;
        }
    }
    Some(Spec::new(EventKind::Map, addr, size as u64))
}

/// An imported pool pointer at `addr` (the driver gives the same address to a second import
/// of the same pointer): recorded as a mapping of the allocation's size, as an IPC open.
fn pool_pointer_imported(result: c_int, addr: u64, pool: *mut c_void) -> Option<Spec> {
    let spec = ipc_opened(result, addr)?;
    imported_pointers::imported(addr);
    Some(spec.handle(pool as u64))
}

/// What a successful free of `addr` recorded as `kind` did: the unmapping of an imported pool
/// pointer, else `kind`.
fn freed(result: c_int, kind: EventKind, addr: u64) -> Spec {
    if result == 0 && addr != 0 && imported_pointers::freed(addr) {
        return Spec::new(EventKind::Unmap, addr, 0);
    }
    Spec::new(kind, addr, 0)
}

/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`: device memory the graph pool holds.
const GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;
/// Devices whose graph pool level is remembered (events only when it changes).
const GRAPH_POOL_DEVICES: usize = 64;
/// The graph pool level last recorded per device.
static GRAPH_POOL_LEVEL: [std::sync::atomic::AtomicU64; GRAPH_POOL_DEVICES] =
    [const { std::sync::atomic::AtomicU64::new(0) }; GRAPH_POOL_DEVICES];

/// `kind` as recorded for a stream-ordered call on `stream` that returned `result`
/// (`per_thread`: a `_ptsz` entry point): a graph node kind when the stream is being captured
/// (the call took or gave back no device memory). The driver is asked only while some capture
/// is in progress; a failed call is recorded as failed.
#[inline]
fn stream_ordered(result: c_int, kind: EventKind, stream: Stream, per_thread: bool) -> EventKind {
    if result != 0 || !stream_capture::any_in_progress() {
        return kind;
    }
    let captured = stream_capture::queryable(stream, per_thread)
        .and_then(stream_capture::status)
        .is_some_and(|status| status != 0);
    match kind {
        EventKind::Alloc if captured => EventKind::GraphAlloc,
        EventKind::Free if captured => EventKind::GraphFree,
        other => other,
    }
}

/// An allocation node added to `graph` by hand: a `graph_alloc` of the node's bytes at the
/// address the driver fixed (`CUDA_MEM_ALLOC_NODE_PARAMS` / `cudaMemAllocNodeParams`, the same
/// layout: the pool properties' location at 8, `bytesize` at 104, `dptr` at 112).
fn memory_node_added(result: c_int, graph: *mut c_void, params: *const c_void) -> Option<Spec> {
    if result != 0 || params.is_null() {
        return None;
    }
    let base = params.cast::<u8>();
    let (size, addr) = unsafe {
        (
            base.add(104).cast::<u64>().read_unaligned(),
            base.add(112).cast::<u64>().read_unaligned(),
        )
    };
    Some(
        Spec::new(EventKind::GraphAlloc, addr, size)
            .handle(graph as u64)
            .device_opt(prop_device(params)),
    )
}

/// `CU_GRAPH_NODE_TYPE_MEM_ALLOC` / `_MEM_FREE`.
const NODE_TYPE_MEM_ALLOC: i32 = 10;
const NODE_TYPE_MEM_FREE: i32 = 11;
/// Where `CUgraphNodeParams` holds the type's parameters (after the type and 3 reserved ints).
const NODE_PARAMS_UNION: usize = 16;

/// A node added with the generic `cuGraphAddNode(_v2)`: a memory node as
/// [`memory_node_added`] (`CUDA_MEM_ALLOC_NODE_PARAMS_v2` has the same layout) or a
/// `graph_free` (`CUDA_MEM_FREE_NODE_PARAMS`: the address); any other node, nothing.
fn generic_node_added(result: c_int, graph: *mut c_void, params: *const c_void) -> Option<Spec> {
    if result != 0 || params.is_null() {
        return None;
    }
    let base = params.cast::<u8>();
    let kind = unsafe { base.cast::<i32>().read_unaligned() };
    let inner = unsafe { base.add(NODE_PARAMS_UNION) };
    match kind {
        NODE_TYPE_MEM_ALLOC => memory_node_added(result, graph, inner.cast()),
        NODE_TYPE_MEM_FREE => {
            let addr = unsafe { inner.cast::<u64>().read_unaligned() };
            Some(Spec::new(EventKind::GraphFree, addr, 0).handle(graph as u64))
        }
        _ => None,
    }
}

/// The device of `stream` (a created stream, not the legacy or per-thread default one) from
/// the driver's `cuStreamGetDevice` (CUDA 12.8 on); `None` when it cannot be asked.
fn stream_device(stream: Stream) -> Option<c_int> {
    static GET_DEVICE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    if (stream as usize) <= 2 {
        return None;
    }
    let real = stream_capture::driver_entry(&GET_DEVICE, c"cuStreamGetDevice");
    if real.is_null() {
        return None;
    }
    let real: unsafe extern "C" fn(Stream, *mut c_int) -> c_int =
        unsafe { std::mem::transmute::<*mut c_void, _>(real) };
    let mut device: c_int = -1;
    (unsafe { real(stream, &mut device) } == 0 && device >= 0).then_some(device)
}

/// The graph pool's level on `device` after a launch, upload or trim, as an event when it
/// changed since the last one recorded. Without a device: the launch stream's (a captured
/// graph's memory is its stream's device's, whatever device is current), else the current
/// device.
fn graph_pool(layer: Layer, device: Option<c_int>, stream: Stream) -> Option<Spec> {
    static GET_ATTRIBUTE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let real = stream_capture::driver_entry(&GET_ATTRIBUTE, c"cuDeviceGetGraphMemAttribute");
    if real.is_null() {
        return None;
    }
    let real: unsafe extern "C" fn(c_int, c_int, *mut u64) -> c_int =
        unsafe { std::mem::transmute::<*mut c_void, _>(real) };
    let device = device
        .or_else(|| stream_device(stream))
        .unwrap_or_else(|| capture::current_device(layer));
    let slot = usize::try_from(device)
        .ok()
        .and_then(|d| GRAPH_POOL_LEVEL.get(d))?;
    let mut reserved: u64 = 0;
    if unsafe { real(device, GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &mut reserved) } != 0 {
        return None;
    }
    if slot.swap(reserved, Ordering::AcqRel) == reserved {
        return None;
    }
    Some(
        Spec::new(EventKind::GraphPool, 0, reserved)
            .stream(stream)
            .device(device),
    )
}

/// Real functions, in [`Hook`] order (null = not resolved yet).
static REAL: [AtomicPtr<c_void>; HOOK_COUNT] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; HOOK_COUNT];

/// Resolves every hooked driver entry point from the application's libcuda handle (run by
/// `real::adopt_libcuda`, which registers it at load).
pub fn resolve_driver(handle: *mut c_void) {
    for (def, real) in HOOKS.iter().zip(REAL.iter()) {
        if def.layer == Layer::Driver {
            real.store(real::real_dlsym(handle, def.cname), Ordering::Release);
        }
    }
}

/// The real function behind `hook`, resolving it on first use.
fn real_function(hook: Hook) -> *mut c_void {
    let slot = &REAL[hook as usize];
    let real = slot.load(Ordering::Acquire);
    if !real.is_null() {
        return real;
    }
    let def = &HOOKS[hook as usize];
    match def.layer {
        Layer::Driver => {
            // A program linked with -lcuda calls our export before any dlsym: find its libcuda.
            if real::libcuda().is_none() {
                return std::ptr::null_mut();
            }
            slot.load(Ordering::Acquire)
        }
        Layer::Runtime => {
            let found = real::next(def.cname);
            slot.store(found, Ordering::Release);
            found
        }
    }
}

/// What a wrapper returns when the library it wraps has no such function (only reachable by a
/// program that looks the shim's export up by name without the library being loaded).
fn missing_real(layer: Layer) -> c_int {
    match layer {
        Layer::Driver => CUDA_ERROR_NOT_INITIALIZED,
        Layer::Runtime => CUDA_RT_ERROR_SYMBOL_NOT_FOUND,
    }
}

/// The wrapper for a driver function asked for by its exported name.
pub fn driver_wrapper_by_name(name: &[u8]) -> Option<*mut c_void> {
    HOOKS
        .iter()
        .find(|def| def.layer == Layer::Driver && def.name.as_bytes() == name)
        .map(|def| def.wrapper as *mut c_void)
}

/// The wrapper bound to the exact driver variant `real` (as the resolver returned it).
pub fn driver_wrapper_by_real(real: *mut c_void) -> Option<(&'static HookDef, *mut c_void)> {
    if real.is_null() {
        return None;
    }
    HOOKS
        .iter()
        .zip(REAL.iter())
        .find(|(def, slot)| def.layer == Layer::Driver && slot.load(Ordering::Acquire) == real)
        .map(|(def, _)| (def, def.wrapper as *mut c_void))
}

fn out(result: c_int, p: *const u64) -> u64 {
    if result == 0 && !p.is_null() {
        unsafe { *p }
    } else {
        0
    }
}

fn out_ptr(result: c_int, p: *const *mut c_void) -> u64 {
    if result == 0 && !p.is_null() {
        unsafe { *p as u64 }
    } else {
        0
    }
}

/// Bytes of a pitched allocation: pitch × height once the driver chose the pitch; the
/// requested width × height if the call failed.
fn pitched(result: c_int, pitch: *const usize, width: usize, height: usize) -> u64 {
    let row = if result == 0 && !pitch.is_null() {
        unsafe { *pitch }
    } else {
        width
    };
    (row as u64).saturating_mul(height as u64)
}

/// `CUmemAllocationProp.location`: type at offset 8 (1 = device), id at offset 12.
fn prop_device(prop: *const c_void) -> Option<i32> {
    if prop.is_null() {
        return None;
    }
    let base = prop.cast::<u8>();
    let (kind, id) = unsafe {
        (
            base.add(8).cast::<i32>().read_unaligned(),
            base.add(12).cast::<i32>().read_unaligned(),
        )
    };
    (kind == 1).then_some(id)
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

/// Bytes per channel of a `CUarray_format`.
fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 0,
    }
}

fn array_bytes(desc: *const ArrayDescriptor) -> u64 {
    let Some(desc) = (unsafe { desc.as_ref() }) else {
        return 0;
    };
    (desc.width as u64)
        .saturating_mul(desc.height.max(1) as u64)
        .saturating_mul(format_bytes(desc.format) * u64::from(desc.channels))
}

/// Bytes of a 3D array, or of a mipmapped array's `levels` levels (each half the previous).
fn array3d_bytes(desc: *const Array3dDescriptor, levels: c_uint) -> u64 {
    let Some(desc) = (unsafe { desc.as_ref() }) else {
        return 0;
    };
    let element = format_bytes(desc.format) * u64::from(desc.channels);
    // A level halves each extent that exists (0 = dimension unused), never below 1.
    let half = |x: u64| if x == 0 { 0 } else { (x / 2).max(1) };
    let (mut w, mut h, mut d) = (desc.width as u64, desc.height as u64, desc.depth as u64);
    let mut total = 0u64;
    for _ in 0..levels.max(1) {
        total = total.saturating_add(w.max(1) * h.max(1) * d.max(1) * element);
        (w, h, d) = (half(w), half(h), half(d));
    }
    total
}

/// Entry-point names, in `api` order, for the log header.
/// PyTorch's allocator's own events come last, as [`torch_trace::API_NAME`].
pub fn api_names() -> Vec<String> {
    HOOKS
        .iter()
        .map(|def| def.name.to_owned())
        .chain([torch_trace::API_NAME.to_owned()])
        .collect()
}
