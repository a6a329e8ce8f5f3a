//! A model of PyTorch's native CUDA caching allocator (`backend:native`), driven by a stream
//! of requests (allocate `size` bytes on a stream, free, `empty_cache()`).
//!
//! It follows `c10/cuda/CUDACachingAllocator.cpp` and the allocator config parser: rounding
//! (512-byte steps or `roundup_power2_divisions`), small (≤ 1 MiB) and large pools, segment
//! sizes (2 MiB, 20 MiB, or a multiple of 2 MiB), best fit by (stream, size, address) within
//! the pool and the stream, splitting and merging, `max_split_size_mb`,
//! `max_non_split_rounding_mb`, `expandable_segments`, `garbage_collection_threshold` with a
//! memory fraction, the "free oversize blocks" and "release every fully free segment and
//! retry" steps, and a device capacity. It reports what `torch.cuda.memory_stats()` would
//! (reserved, allocated, inactive split bytes, `cudaMalloc` count, retries, OOMs), the state
//! at peak reserved (reserved − allocated, largest free block vs. total free) and where the
//! first allocation would fail.
//!
//! ```
//! use vramshim_sim::{Config, Outcome, Request, Simulator, MIB};
//!
//! let mut sim = Simulator::new(Config::parse("max_split_size_mb:128").unwrap()).unwrap();
//! sim.apply(0, &Request::Alloc { id: 1, size: 3 * MIB, stream: 0 });
//! sim.apply(1, &Request::Free { id: 1 });
//! let s = sim.stats();
//! assert_eq!(s.peak_reserved, 20 * MIB); // a 3 MiB request takes a 20 MiB segment
//! assert_eq!(s.peak_allocated, 3 * MIB);
//! assert_eq!(s.num_device_alloc, 1);
//! ```
//!
//! CUDA graphs' private pools are modelled ([`Request::BeginCapture`],
//! [`Request::EndCapture`], [`Request::ReleasePool`]): a captured stream's allocations come
//! from the capture's pool, whose segments only it uses and which `empty_cache()` and the
//! retry release only once no graph uses it; no release-and-retry while a capture is under
//! way. Checkpointing a pool's state (inductor's CUDA graph trees) is not.
//!
//! Not modelled: `record_stream` (blocks freed while in use on another stream), free-memory
//! callbacks, IPC, and the other backends (`cudaMallocAsync`, no caching).
//!
//! Modelling choices:
//!
//! - A `cudaMalloc` (or the pages an expandable segment maps) succeeds while reserved memory
//!   stays within [`Config::capacity`] less what other libraries hold then
//!   ([`Request::ExternalAlloc`]: cuBLAS's handle memory, NCCL's buffers); there is no driver
//!   granularity and no other process.
//! - The memory fraction is taken of the capacity (PyTorch takes it of the device's total
//!   memory; set the capacity to the total to match).
//! - An expandable segment reserves 9/8 of the capacity as address space (PyTorch: 9/8 of
//!   the device's total memory), at most 9/8 TiB.
//! - Addresses are simulated: segments are placed one after another, at rising addresses
//!   or, with [`Simulator::set_address_order`], falling ones (the driver's order, which
//!   callers take from a recording; with rising addresses the lower address is also the
//!   older segment, which is how torch 2.15 breaks ties), and never reuse an address (released expandable
//!   segments reuse theirs), which only matters for the tie-break between free blocks of
//!   equal size.
//! - A failed allocation is dropped and the run goes on; a later free of its id is ignored.
//!   Requests above 64 PiB fail at once.
//! - A cuDNN convolution's workspace ([`Request::Workspace`]) that does not fit is survived
//!   as torch survives it (counted in `num_ooms`, not [`Stats::first_oom`]), and the engine
//!   torch falls back to is taken to need no workspace (the fake cuDNN's; a real cuDNN's next
//!   engine may ask for a smaller one, which a recording does not have).
//! - `cudnn.benchmark`'s search workspace ([`Request::SearchWorkspace`]) is asked for only if
//!   no larger than the free device memory or the largest cached free block, and halved after
//!   each failure (survived OOMs); a shortened search leaves the convolution on the engine
//!   with no workspace. A searched plan whose cached workspace fails is searched again, the
//!   cache emptied (torch's default `_cudnn_get_conv_benchmark_empty_cache()`), then tried.
//! - With `expandable_segments` and `max_split_size_mb` together, the "free oversize cached
//!   blocks" step before the final retry is skipped: PyTorch would hand an expandable block
//!   to `cudaFree` there and stop on an internal assertion (in the versions read).
//! - `roundup_power2_divisions:[…,>:N]` follows current PyTorch: `>` sets the intervals
//!   above the last one listed (older versions also overwrote the last one).
//! - [`Stats::at_peak`] is measured at the end of the request that first took reserved
//!   memory to its peak.

#![warn(missing_docs)]

mod config;
mod hash;
mod sim;

pub use config::{Config, ROUNDUP_INTERVALS};
pub use sim::{
    AddressOrder, AtPeak, BlockInfo, ExternalFailure, OomEvent, Outcome, Request, SegmentInfo,
    Simulator, Stats,
};

/// One kibibyte.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;

/// Every block size is a multiple of this (`kMinBlockSize`, 512 B).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served from the small pool (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool, and its expandable page size (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Segment size for requests of (1 MiB, 10 MiB), and the expandable page size of the large
/// pool (`kLargeBuffer`, 20 MiB).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests from this size on get a segment of their own size (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Larger segments are rounded up to a multiple of this (`kRoundLarge`, 2 MiB).
pub const ROUND_LARGE: u64 = 2 * MIB;

/// The size PyTorch hands out for a request of `size` bytes (`round_size`): 512 for anything
/// below 512; with `d = roundup_power2_divisions` for the size's interval, `d > 1` and
/// `size > 512·d`, the next of `d` equal steps between the powers of two around `size` (a
/// power of two stays itself); otherwise the next multiple of 512.
pub fn round_size(size: u64, config: &Config) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = u64::from(config.divisions_for(size));
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        roundup_power2_next_division(size, d)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between the powers of two below
/// and above it (e.g. 1200 with 4 divisions: steps 1024, 1280, 1536, 1792 → 1280).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down.saturating_add(step)
    }
}

/// Size of the segment PyTorch `cudaMalloc`s when no cached block fits a rounded request
/// (`get_allocation_size`): 2 MiB for the small pool (≤ 1 MiB), 20 MiB below 10 MiB, else the
/// request rounded up to a multiple of 2 MiB.
pub fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests;
