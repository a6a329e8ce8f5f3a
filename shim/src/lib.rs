//! `libvramshim.so`: loaded with `LD_PRELOAD` into an unmodified CUDA program, it records every
//! device-memory allocation, free and failed allocation into a compact, crash-safe log.
//!
//! How calls are reached (see `interpose` and `resolver`): exported driver and runtime
//! symbols, an exported `dlsym` that hands out wrappers to a libcuda handle, and wrappers of
//! the driver's resolver and of `cudaGetDriverEntryPoint*`. What each entry point records is
//! declared once in `table`. Hooks append to per-thread rings (`capture`); a writer thread
//! drains them into the log (`writer`); `lifecycle` keeps the log complete across fork, exec,
//! exit and crashes.
//!
//! Layers (a module imports only modules below it; no circle):
//!
//! | layer | modules | |
//! |---|---|---|
//! | lifecycle | `lifecycle` | start, fork, signals, `_exit`/exec, thread exit; registers the starter and the libcuda resolver below at load |
//! | entry points | `interpose` → `resolver` → `table` → `torch_report` → `torch_trace`, `stream_capture`; `mark` | exported `dlsym`, the driver's resolver, the hook table; the tracker attached to PyTorch's caching allocator (its tensors, reported by the allocator itself), or in PyTorch 2.1 its profiler report interposed; the stream captures in progress; the program's own annotations (`vramshim_mark`) |
//! | capture | `capture` → `stacks` → `python`, `unwind` | the hot path: what a hooked call records, call stacks |
//! | writer | `writer` → `flight` | drains the rings, owns the log; ring mode's window |
//! | base | `ring`, `real`, `altstack`, `process`, `config`, `sync` | rings, real functions, alternate stacks, settings and state, fork-safe locks |
//!
//! The hot path never calls up into the lifecycle: the first hooked call starts recording
//! through the function `lifecycle` registered with `process::set_starter`, and adopting a
//! libcuda handle resolves the hook table through `real::set_on_adopt`. What may run in each
//! context (hot path, signal handler, fork child, vfork child, exit, exec, thread exit) is in
//! `docs/shim-contexts.md`.
//!
//! The shim never changes what the program sees: return values and out-parameters pass
//! through untouched, every panic is caught, and any internal failure turns recording off with
//! one warning line.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

mod altstack;
mod capture;
mod config;
mod flight;
mod imported_pointers;
mod interpose;
mod lifecycle;
mod mark;
mod process;
mod python;
mod real;
mod resolver;
mod ring;
mod stacks;
mod stream_capture;
mod sync;
mod table;
mod torch_report;
mod torch_trace;
mod unwind;
mod writer;

pub(crate) use process::{debug, guard, warn, warn_static};
