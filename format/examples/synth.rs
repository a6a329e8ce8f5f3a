//! Writes a synthetic but realistic vramshim log, for benchmarks and fuzzing seeds.
//!
//! ```text
//! cargo run --release -p vramshim-format --example synth -- --events N -o FILE [--seed S]
//!     [--stacks K [--frames F]] [--plain] [--continued R]
//! ```
//!
//! `--continued R`: chunks of R records, continued ones (format 6) after a key chunk, as the
//! recorder writes a steady stream's.
//!
//! The log is framed exactly as the recorder's writer frames it (header, then compressed chunks
//! closed at 256 KiB of payload, definitions before the events that use them; `--plain`: plain
//! chunks, as the crash path and version 1 write them) and holds: module
//! definitions, about 2,000 distinct native stacks of 10 to 30 frames (`--stacks K`: K, each
//! used at least once when the log is long enough; `--frames F`: F frames) (each defined before its
//! first use), 8 named threads, allocations and frees on devices 0 and 1 (plus some pinned host
//! memory) through the runtime, driver, stream-ordered and VMM entry points, sizes from a skewed
//! distribution, a bounded live set (at most 50,000 allocations), a few hundred leaks, a handful
//! of failed allocations with the driver's free/total, and a `mem_info` sample per device about
//! once per simulated second. Every free names a live address, and the live addresses of a
//! device are distinct. Timestamps never go backwards (about 1 µs apart).
//!
//! Same seed and size, same bytes. Memory use does not grow with the number of events: chunks
//! are streamed to the file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

use vramshim_format::{
    ChunkBuilder, Event, EventKind, FORMAT_VERSION, Frame, HOST_DEVICE, Header, MemInfo, ModuleDef,
    RECORDED_ENV, Record, StackDef, ThreadName,
};

/// The recorder closes a chunk at this payload size (`shim/src/writer.rs`).
const CHUNK_BYTES: usize = 256 << 10;
const STACKS: usize = 2_000;
const THREADS: usize = 8;
const MAX_LIVE: usize = 50_000;
const DEVICE_TOTAL: u64 = 80 << 30;
/// Bytes the CUDA context and modules take on each device (seen only through `mem_info`).
const CONTEXT_BYTES: u64 = 600 << 20;
/// Above this many live bytes on a device, frees are preferred to allocations.
const LIVE_BYTES_BUDGET: u64 = 64 << 30;
const SECOND_NS: u64 = 1_000_000_000;
/// `CUDA_ERROR_OUT_OF_MEMORY` / `cudaErrorMemoryAllocation`.
const OUT_OF_MEMORY: u32 = 2;

const APIS: [&str; 14] = [
    "cudaMalloc",
    "cudaFree",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cudaMallocHost",
    "cudaFreeHost",
];
const CUDA_MALLOC: u16 = 0;
const CUDA_FREE: u16 = 1;
const CU_MEM_ALLOC: u16 = 2;
const CU_MEM_FREE: u16 = 3;
const CUDA_MALLOC_ASYNC: u16 = 4;
const CUDA_FREE_ASYNC: u16 = 5;
const CU_MEM_CREATE: u16 = 6;
const CU_MEM_RELEASE: u16 = 7;
const CU_MEM_MAP: u16 = 8;
const CU_MEM_UNMAP: u16 = 9;
const CU_MEM_ADDRESS_RESERVE: u16 = 10;
const CU_MEM_ADDRESS_FREE: u16 = 11;
const CUDA_MALLOC_HOST: u16 = 12;
const CUDA_FREE_HOST: u16 = 13;

const THREAD_NAMES: [&str; THREADS] = [
    "python3",
    "pt_autograd_0",
    "pt_autograd_1",
    "pt_main_thread",
    "nccl_comm_0",
    "nccl_comm_1",
    "pt_data_worker",
    "cuda-EvtHandlr",
];

/// (path, size of the mapped range): where stack frames point.
const MODULES: [(&str, u64); 8] = [
    ("/usr/bin/python3.11", 6 << 20),
    ("/usr/lib/x86_64-linux-gnu/libc.so.6", 2 << 20),
    (
        "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so",
        30 << 20,
    ),
    (
        "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so",
        900 << 20,
    ),
    (
        "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10_cuda.so",
        2 << 20,
    ),
    (
        "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
        1 << 20,
    ),
    (
        "/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
        250 << 20,
    ),
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01", 40 << 20),
];

/// splitmix64: tiny, fast, good enough for synthetic data, and deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// How an allocation was made, so its free uses the matching entry point(s).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Runtime,
    Driver,
    Async,
    /// Reserve + create + map; freed by unmap + release + unreserve.
    Vmm,
    Host,
}

impl Family {
    /// Events written to free one allocation of this family.
    fn free_cost(self) -> u64 {
        if self == Family::Vmm { 3 } else { 1 }
    }
}

#[derive(Clone, Copy)]
struct Live {
    addr: u64,
    /// The block size the address was carved at (reused for the same class only).
    block: u64,
    size: u64,
    handle: u64,
    stream: u64,
    /// Index into `Synth::devices`.
    device: usize,
    family: Family,
}

/// Hands out addresses per device: freed blocks are reused for the same block size (as a
/// caching allocator would), new ones come from a bump pointer, so live addresses are unique.
struct AddressSpace {
    next: u64,
    free_blocks: HashMap<u64, Vec<u64>>,
}

impl AddressSpace {
    fn new(base: u64) -> Self {
        AddressSpace {
            next: base,
            free_blocks: HashMap::new(),
        }
    }

    fn take(&mut self, block: u64) -> u64 {
        if let Some(addr) = self.free_blocks.get_mut(&block).and_then(Vec::pop) {
            return addr;
        }
        let addr = self.next;
        self.next += block;
        addr
    }

    fn give_back(&mut self, block: u64, addr: u64) {
        self.free_blocks.entry(block).or_default().push(addr);
    }
}

struct Device {
    ordinal: i32,
    space: AddressSpace,
    live_bytes: u64,
    /// Time of the last `mem_info` sample (`None` before the device's first event).
    last_sample: Option<u64>,
}

struct Synth<W: Write> {
    rng: Rng,
    file: W,
    chunk: ChunkBuilder,
    /// Chunks written uncompressed.
    plain: bool,
    /// Records per continued chunk (0: none).
    continued: usize,
    out: Vec<u8>,
    bytes_written: u64,
    t_ns: u64,
    thread: usize,
    tids: [u32; THREADS],
    thread_named: [bool; THREADS],
    stack_defined: Vec<bool>,
    /// With more stacks than the default: the next stack never used yet (`usize::MAX`: off).
    next_new_stack: usize,
    /// Frames per stack (None: 10 to 30).
    frames: Option<usize>,
    stack_seed: u64,
    module_bases: Vec<u64>,
    devices: [Device; 3],
    live: Vec<Live>,
    /// Events needed to free everything in `live`.
    live_free_cost: u64,
    next_handle: u64,
    events: u64,
    records: u64,
    leaks: u64,
    failures: u64,
}

impl<W: Write> Synth<W> {
    fn push(&mut self, record: &Record) -> std::io::Result<()> {
        self.chunk.push(record);
        self.records += 1;
        if let Record::Event(_) = record {
            self.events += 1;
        }
        if self.chunk.payload_len() >= CHUNK_BYTES
            || (self.continued > 0 && self.chunk.records() >= self.continued)
        {
            self.finish_chunk()?;
        }
        Ok(())
    }

    fn finish_chunk(&mut self) -> std::io::Result<()> {
        if self.plain {
            self.chunk.finish_into(&mut self.out);
        } else {
            self.chunk.finish_compressed_into(&mut self.out);
        }
        self.file.write_all(&self.out)?;
        self.bytes_written += self.out.len() as u64;
        self.out.clear();
        Ok(())
    }

    /// Moves the clock on by about a microsecond.
    fn tick(&mut self) {
        self.t_ns += 200 + self.rng.below(1_600);
    }

    /// Sometimes another thread takes over; names a thread the first time it shows up.
    fn pick_thread(&mut self) -> std::io::Result<u32> {
        if self.rng.chance(0.08) {
            // Thread 0 (the Python main thread) does most of the work.
            self.thread = if self.rng.chance(0.5) {
                0
            } else {
                self.rng.below(THREADS as u64) as usize
            };
        }
        let index = self.thread;
        if !self.thread_named[index] {
            self.thread_named[index] = true;
            self.push(&Record::ThreadName(ThreadName {
                thread: self.tids[index],
                name: THREAD_NAMES[index].to_owned(),
            }))?;
        }
        Ok(self.tids[index])
    }

    /// A stack id (1..=K, K = 2000 unless `--stacks`) with a skewed popularity; defined before
    /// its first use. With `--stacks` above 2000, every stack is used once first.
    fn pick_stack(&mut self) -> std::io::Result<u32> {
        let count = self.stack_defined.len();
        let index = if self.next_new_stack < count {
            self.next_new_stack += 1;
            self.next_new_stack - 1
        } else {
            let u = self.rng.unit();
            ((u * u * u) * count as f64) as usize % count
        };
        if !self.stack_defined[index] {
            self.stack_defined[index] = true;
            let frames = self.stack_frames(index);
            self.push(&Record::Stack(StackDef {
                id: index as u32 + 1,
                frames,
            }))?;
        }
        Ok(index as u32 + 1)
    }

    /// Frames of stack `index`, innermost first: driver, runtime, c10/torch, Python, libc.
    fn stack_frames(&self, index: usize) -> Vec<Frame> {
        let mut rng = Rng(self.stack_seed ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let depth = self.frames.unwrap_or_else(|| 10 + rng.below(21) as usize);
        // Module of each layer, innermost first (indices into MODULES).
        const LAYERS: [usize; 6] = [7, 5, 4, 3, 2, 0];
        let mut frames = Vec::with_capacity(depth);
        let inner = 2 + rng.below(3) as usize;
        for position in 0..depth {
            let module = if position + 1 == depth {
                1 // __libc_start_main
            } else if position < inner {
                LAYERS[position.min(2)]
            } else if position < depth / 2 {
                if rng.chance(0.3) { 6 } else { 3 }
            } else if position < depth * 3 / 4 {
                2
            } else {
                0
            };
            let (_, len) = MODULES[module];
            // Call sites cluster: a small set of offsets per module.
            let offset = (rng.below(len / 64) * 64 + rng.below(64)) % len;
            frames.push(Frame::Native(self.module_bases[module] + offset));
        }
        frames
    }

    /// Writes the device's free/total at its first use and then about once a second.
    fn sample(&mut self, device: usize) -> std::io::Result<()> {
        let dev = &self.devices[device];
        if dev.ordinal < 0 {
            return Ok(());
        }
        if dev
            .last_sample
            .is_some_and(|last| self.t_ns.saturating_sub(last) < SECOND_NS)
        {
            return Ok(());
        }
        let record = Record::MemInfo(MemInfo {
            t_ns: self.t_ns,
            device: dev.ordinal,
            free: self.device_free(device),
            total: DEVICE_TOTAL,
        });
        self.devices[device].last_sample = Some(self.t_ns);
        self.push(&record)
    }

    fn device_free(&self, device: usize) -> u64 {
        DEVICE_TOTAL.saturating_sub(CONTEXT_BYTES + self.devices[device].live_bytes)
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &mut self,
        kind: EventKind,
        api: u16,
        device: usize,
        addr: u64,
        size: u64,
        handle: u64,
        stream: u64,
    ) -> std::io::Result<()> {
        self.tick();
        let thread = self.pick_thread()?;
        let stack = self.pick_stack()?;
        self.push(&Record::Event(Event {
            kind,
            api,
            t_ns: self.t_ns,
            thread,
            device: self.devices[device].ordinal,
            stream,
            addr,
            size,
            handle,
            result: 0,
            stack,
            mem_info: None,
        }))?;
        self.sample(device)
    }

    /// A requested size: many small, some medium, few large; powers of two and odd sizes.
    fn pick_size(&mut self) -> u64 {
        let roll = self.rng.below(1000);
        let base = if roll < 550 {
            // Small tensors: 4 B .. 1 MiB, mostly below 64 KiB.
            let shift = 2 + self.rng.below(15);
            1u64 << (shift + u64::from(self.rng.chance(0.1)) * 4)
        } else if roll < 900 {
            // Activations: 1 .. 64 MiB.
            (1u64 << 20) << self.rng.below(7)
        } else if roll < 995 {
            // Caching-allocator segments and weights: multiples of 2 MiB up to 512 MiB.
            (2u64 << 20) * (1 + self.rng.below(256))
        } else {
            // Rare huge buffers: 1 .. 8 GiB.
            (1u64 << 30) << self.rng.below(4)
        };
        if self.rng.chance(0.35) {
            // Odd sizes: a shape that is not a power of two.
            let odd = base / 8 * (1 + self.rng.below(15)) / 2 + self.rng.below(97);
            odd.max(1)
        } else {
            base
        }
    }

    /// Allocates one block; returns false if nothing was written (no room left).
    fn allocate(&mut self, remaining: u64, leak: bool) -> std::io::Result<bool> {
        let device = match self.rng.below(100) {
            0..=54 => 0,
            55..=96 => 1,
            _ => 2, // pinned host memory
        };
        let family = if device == 2 {
            Family::Host
        } else {
            match self.rng.below(100) {
                0..=59 => Family::Runtime,
                60..=69 => Family::Driver,
                70..=94 => Family::Async,
                _ => Family::Vmm,
            }
        };
        let mut size = self.pick_size();
        if family == Family::Host {
            size = size.min(256 << 20);
        }
        if leak {
            // What leaks is usually small: a cached workspace, a forgotten buffer.
            size = size.min(64 << 20);
        }
        if family == Family::Vmm {
            // VMM granularity is 2 MiB.
            size = size.div_ceil(2 << 20) * (2 << 20);
        }
        let cost = if family == Family::Vmm { 3 } else { 1 };
        let free_cost = if leak { 0 } else { family.free_cost() };
        if remaining < cost + free_cost + self.live_free_cost
            || self.devices[device].live_bytes + size > LIVE_BYTES_BUDGET
        {
            return Ok(false);
        }
        let block = if size <= 1 << 20 {
            size.div_ceil(512) * 512
        } else {
            size.div_ceil(2 << 20) * (2 << 20)
        };
        let addr = self.devices[device].space.take(block);
        self.devices[device].live_bytes += size;
        let mut live = Live {
            addr,
            block,
            size,
            handle: 0,
            stream: 0,
            device,
            family,
        };
        match family {
            Family::Runtime => {
                self.event(EventKind::Alloc, CUDA_MALLOC, device, addr, size, 0, 0)?;
            }
            Family::Driver => {
                self.event(EventKind::Alloc, CU_MEM_ALLOC, device, addr, size, 0, 0)?;
            }
            Family::Host => {
                self.event(EventKind::Alloc, CUDA_MALLOC_HOST, device, addr, size, 0, 0)?;
            }
            Family::Async => {
                live.stream = 0x5600_0000_0000 + 0x40 * self.rng.below(4);
                self.event(
                    EventKind::Alloc,
                    CUDA_MALLOC_ASYNC,
                    device,
                    addr,
                    size,
                    0,
                    live.stream,
                )?;
            }
            Family::Vmm => {
                self.next_handle += 1;
                live.handle = 0x7000_0000 + self.next_handle * 16;
                self.event(
                    EventKind::Reserve,
                    CU_MEM_ADDRESS_RESERVE,
                    device,
                    addr,
                    size,
                    0,
                    0,
                )?;
                self.event(
                    EventKind::Create,
                    CU_MEM_CREATE,
                    device,
                    0,
                    size,
                    live.handle,
                    0,
                )?;
                self.event(
                    EventKind::Map,
                    CU_MEM_MAP,
                    device,
                    addr,
                    size,
                    live.handle,
                    0,
                )?;
            }
        }
        if leak {
            self.leaks += 1;
        } else {
            self.live_free_cost += free_cost;
            self.live.push(live);
        }
        Ok(true)
    }

    /// Frees one live allocation: usually a recent one (tensors die young), sometimes any.
    fn free_one(&mut self) -> std::io::Result<()> {
        let len = self.live.len() as u64;
        let index = if self.rng.chance(0.7) {
            let back = (self.rng.unit() * self.rng.unit() * 64.0) as u64;
            len - 1 - back.min(len - 1)
        } else {
            self.rng.below(len)
        };
        let live = self.live.swap_remove(index as usize);
        self.live_free_cost -= live.family.free_cost();
        let device = live.device;
        match live.family {
            Family::Runtime => {
                self.event(EventKind::Free, CUDA_FREE, device, live.addr, 0, 0, 0)?
            }
            Family::Driver => {
                self.event(EventKind::Free, CU_MEM_FREE, device, live.addr, 0, 0, 0)?
            }
            Family::Host => {
                self.event(EventKind::Free, CUDA_FREE_HOST, device, live.addr, 0, 0, 0)?
            }
            Family::Async => self.event(
                EventKind::Free,
                CUDA_FREE_ASYNC,
                device,
                live.addr,
                0,
                0,
                live.stream,
            )?,
            Family::Vmm => {
                self.event(
                    EventKind::Unmap,
                    CU_MEM_UNMAP,
                    device,
                    live.addr,
                    live.size,
                    0,
                    0,
                )?;
                self.event(
                    EventKind::Release,
                    CU_MEM_RELEASE,
                    device,
                    0,
                    0,
                    live.handle,
                    0,
                )?;
                self.event(
                    EventKind::Unreserve,
                    CU_MEM_ADDRESS_FREE,
                    device,
                    live.addr,
                    live.size,
                    0,
                    0,
                )?;
            }
        }
        let dev = &mut self.devices[device];
        dev.live_bytes -= live.size;
        dev.space.give_back(live.block, live.addr);
        Ok(())
    }

    /// A request the device cannot satisfy: the event carries the driver's free/total.
    fn fail(&mut self) -> std::io::Result<()> {
        let device = self.rng.below(2) as usize;
        self.tick();
        let thread = self.pick_thread()?;
        let stack = self.pick_stack()?;
        let free = self.device_free(device);
        let size = (free + (1 << 30)).div_ceil(2 << 20) * (2 << 20);
        self.failures += 1;
        self.push(&Record::Event(Event {
            kind: EventKind::AllocFailed,
            api: CUDA_MALLOC,
            t_ns: self.t_ns,
            thread,
            device: self.devices[device].ordinal,
            size,
            result: OUT_OF_MEMORY,
            stack,
            mem_info: Some((free, DEVICE_TOTAL)),
            ..Event::default()
        }))
    }
}

struct Options {
    events: u64,
    output: String,
    seed: u64,
    /// Distinct stacks (default [`STACKS`]). Above the default, each allocation uses a new
    /// stack until all K are defined, so a log of at least 2K events defines every one.
    stacks: usize,
    /// Frames per stack; None: 10 to 30.
    frames: Option<usize>,
    /// Plain chunks instead of compressed ones.
    plain: bool,
    /// Records per chunk, continued chunks (0: chunks closed at 256 KiB, each a key chunk).
    continued: usize,
}

fn parse_count(text: &str) -> Option<u64> {
    let text = text.replace('_', "");
    let (digits, scale) = match text.as_bytes().last()? {
        b'k' | b'K' => (&text[..text.len() - 1], 1_000),
        b'm' | b'M' => (&text[..text.len() - 1], 1_000_000),
        b'g' | b'G' => (&text[..text.len() - 1], 1_000_000_000),
        _ => (&text[..], 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

fn parse_args() -> Result<Options, String> {
    let mut events = None;
    let mut output = None;
    let mut seed = 1;
    let mut stacks = STACKS;
    let mut frames = None;
    let mut plain = false;
    let mut continued = 0;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--events" | "-n" => {
                let text = value("--events")?;
                events = Some(parse_count(&text).ok_or(format!("bad event count {text:?}"))?);
            }
            "-o" | "--output" => output = Some(value("-o")?),
            "--seed" => {
                let text = value("--seed")?;
                seed = text.parse().map_err(|_| format!("bad seed {text:?}"))?;
            }
            "--stacks" => {
                let text = value("--stacks")?;
                stacks = parse_count(&text)
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|&n| n > 0 && n < u32::MAX as usize)
                    .ok_or(format!("bad stack count {text:?}"))?;
            }
            "--frames" => {
                let text = value("--frames")?;
                frames = Some(
                    text.parse()
                        .ok()
                        .filter(|&n| n > 0 && n <= 4096)
                        .ok_or(format!("bad frame count {text:?}"))?,
                );
            }
            "--plain" => plain = true,
            "--continued" => {
                let text = value("--continued")?;
                continued = text
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("bad records per chunk {text:?}"))?;
            }
            "-h" | "--help" => {
                return Err(String::new());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Options {
        events: events.ok_or("--events N is required")?,
        output: output.ok_or("-o FILE is required")?,
        seed,
        stacks,
        frames,
        plain,
        continued,
    })
}

fn generate(options: &Options) -> std::io::Result<Synth<BufWriter<File>>> {
    let mut rng = Rng(options.seed);
    let pid = 1000 + rng.below(60_000) as u32;
    let header = Header {
        version: FORMAT_VERSION,
        pid,
        ppid: pid - 1 - rng.below(50) as u32,
        argv: vec!["synth".to_owned()],
        start_unix_ns: 1_700_000_000_000_000_000 + rng.below(1 << 50),
        start_mono_ns: 1_000_000_000_000 + rng.below(1 << 40),
        hostname: "synth-node".to_owned(),
        env: RECORDED_ENV
            .iter()
            .map(|name| {
                let value = match *name {
                    "CUDA_VISIBLE_DEVICES" => Some("0,1".to_owned()),
                    "PYTORCH_CUDA_ALLOC_CONF" => Some("expandable_segments:True".to_owned()),
                    _ => None,
                };
                ((*name).to_owned(), value)
            })
            .collect(),
        apis: APIS.iter().map(|&api| api.to_owned()).collect(),
        stack_mode: "native".to_owned(),
        mode: "stream".to_owned(),
        recorder: "synth".to_owned(),
        time_resolution_ns: 1,
    };
    let mut file = BufWriter::with_capacity(1 << 20, File::create(&options.output)?);
    let header_bytes = header.encode();
    file.write_all(&header_bytes)?;

    // Modules are laid out like a real process: the executable low, libraries high.
    let mut module_bases = Vec::new();
    let mut next_lib = 0x7f3a_0000_0000u64 + (rng.below(1 << 20) << 12);
    for (index, &(_, len)) in MODULES.iter().enumerate() {
        if index == 0 {
            module_bases.push(0x5555_5555_4000 + (rng.below(1 << 16) << 12));
        } else {
            module_bases.push(next_lib);
            next_lib += (len + (1 << 20)).div_ceil(4096) * 4096;
        }
    }
    let mut tid = pid;
    let tids = std::array::from_fn(|index| {
        if index > 0 {
            tid += 1 + rng.below(7) as u32;
        }
        tid
    });
    let stack_seed = rng.next();
    let mut synth = Synth {
        rng,
        file,
        chunk: if options.continued > 0 {
            ChunkBuilder::new().with_continued_chunks()
        } else {
            ChunkBuilder::new()
        },
        plain: options.plain,
        continued: options.continued,
        out: Vec::with_capacity(CHUNK_BYTES + (64 << 10)),
        bytes_written: header_bytes.len() as u64,
        t_ns: 0,
        thread: 0,
        tids,
        thread_named: [false; THREADS],
        stack_defined: vec![false; options.stacks],
        next_new_stack: if options.stacks > STACKS {
            0
        } else {
            usize::MAX
        },
        frames: options.frames,
        stack_seed,
        module_bases,
        devices: [
            Device {
                ordinal: 0,
                space: AddressSpace::new(0x7e00_0000_0000),
                live_bytes: 0,
                last_sample: None,
            },
            Device {
                ordinal: 1,
                space: AddressSpace::new(0x7d00_0000_0000),
                live_bytes: 0,
                last_sample: None,
            },
            Device {
                ordinal: HOST_DEVICE,
                space: AddressSpace::new(0x7c00_0000_0000),
                live_bytes: 0,
                last_sample: None,
            },
        ],
        live: Vec::new(),
        live_free_cost: 0,
        next_handle: 0,
        events: 0,
        records: 0,
        leaks: 0,
        failures: 0,
    };
    for (index, &(path, len)) in MODULES.iter().enumerate() {
        let start = synth.module_bases[index];
        let build_id = (0..20).map(|_| synth.rng.next() as u8).collect();
        synth.push(&Record::Module(ModuleDef {
            path: path.to_owned(),
            load_bias: start,
            start,
            end: start + len,
            build_id,
        }))?;
    }

    let total = options.events;
    // A few hundred leaks spread over the run (fewer in a small log).
    let leak_target = (total / 200).min(300);
    let leak_chance = if total == 0 {
        0.0
    } else {
        leak_target as f64 * 2.0 / total as f64
    };
    // A handful of failed allocations, evenly spaced.
    let failures_planned = (total / 100_000).clamp(1, 6);
    let fail_every = total / (failures_planned + 1) + 1;
    // Training iterations: allocations pile up in the forward pass, drain in the backward one.
    let iteration = 20_000u64.min(total / 4 + 2);
    while synth.events < total {
        let written = synth.events;
        let remaining = total - written;
        if written >= fail_every * (synth.failures + 1)
            && synth.failures < failures_planned
            && remaining > synth.live_free_cost
        {
            synth.fail()?;
            continue;
        }
        let live = synth.live.len();
        let must_free = remaining <= synth.live_free_cost || live >= MAX_LIVE;
        let want_alloc = if must_free || live == 0 {
            !must_free
        } else {
            let ramp = (written as f64 / (total as f64 / 4.0)).min(1.0);
            let target = 200.0 + (MAX_LIVE as f64 * 0.9 - 200.0) * ramp;
            let forward = (written % iteration) < iteration / 2;
            let p =
                0.5 + if forward { 0.12 } else { -0.12 } + 0.3 * (target - live as f64) / target;
            synth.rng.chance(p.clamp(0.05, 0.95))
        };
        if want_alloc {
            let leak = synth.leaks < leak_target && synth.rng.chance(leak_chance);
            if synth.allocate(remaining, leak)? {
                continue;
            }
        }
        if !synth.live.is_empty() {
            synth.free_one()?;
        } else if !synth.allocate(remaining, true)? {
            // One event left and nothing live: it can only be a leak or a failure.
            synth.fail()?;
        }
    }
    synth.finish_chunk()?;
    synth.file.flush()?;
    Ok(synth)
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(options) => options,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("synth: {message}");
            }
            eprintln!(
                "usage: synth --events N -o FILE [--seed S] [--stacks K] [--frames F] [--plain] [--continued R]   (N, K may end in k, M or G)"
            );
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    match generate(&options) {
        Ok(synth) => {
            let seconds = started.elapsed().as_secs_f64();
            println!(
                "events written: {} ({} records: {} stacks, {} leaks, {} failed allocations)",
                synth.events,
                synth.records,
                synth.stack_defined.iter().filter(|&&d| d).count(),
                synth.leaks,
                synth.failures
            );
            println!(
                "file size: {} bytes ({:.1} MiB)",
                synth.bytes_written,
                synth.bytes_written as f64 / (1u64 << 20) as f64
            );
            if synth.events > 0 {
                println!(
                    "bytes/event: {:.2}",
                    synth.bytes_written as f64 / synth.events as f64
                );
            }
            eprintln!(
                "synth: {:.2} s, {:.1} M events/s",
                seconds,
                synth.events as f64 / seconds / 1e6
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("synth: cannot write {}: {err}", options.output);
            ExitCode::FAILURE
        }
    }
}
