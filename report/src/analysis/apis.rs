//! API families: which kind of allocator an entry point belongs to, from its exact name.

/// How the summary groups entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// `cudaMalloc`, `cudaFree`, `cudaMallocPitch`.
    Runtime,
    /// `cuMemAlloc_v2`, `cuMemFree_v2`, pitch allocations, arrays.
    Driver,
    /// `cu(da)MallocAsync`, `...FromPoolAsync`, `...FreeAsync`, pool trims.
    StreamOrdered,
    /// `cuMemAddressReserve`/`Free`, `cuMemCreate`/`Release`, `cuMemMap`/`Unmap`.
    Vmm,
    /// `cu(da)MallocManaged`.
    Managed,
    /// Pinned host memory: `cudaMallocHost`, `cudaHostAlloc`, `cuMemHostRegister`, ...
    PinnedHost,
    /// The device's graph memory pool, as `cu(da)GraphLaunch`/`Upload` and
    /// `cu(da)DeviceGraphMemTrim` left it (its level; captured allocations are graph nodes,
    /// not device memory).
    GraphPool,
}

impl Family {
    /// Every family, in report order (declaration order: a family's index is `as usize`).
    pub const ALL: [Family; 7] = [
        Family::Runtime,
        Family::Driver,
        Family::StreamOrdered,
        Family::Vmm,
        Family::Managed,
        Family::PinnedHost,
        Family::GraphPool,
    ];

    /// Name in text and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Family::Runtime => "runtime",
            Family::Driver => "driver",
            Family::StreamOrdered => "stream_ordered",
            Family::Vmm => "vmm",
            Family::Managed => "managed",
            Family::PinnedHost => "pinned_host",
            Family::GraphPool => "graph_pool",
        }
    }

    /// The family of the entry point called `api`.
    pub fn of(api: &str) -> Family {
        if api.contains("Graph") {
            Family::GraphPool
        } else if api.contains("Managed") {
            Family::Managed
        } else if api.contains("Host") {
            Family::PinnedHost
        } else if api.contains("Async") || api.contains("Pool") {
            Family::StreamOrdered
        } else if [
            "cuMemAddress",
            "cuMemCreate",
            "cuMemRelease",
            "cuMemMap",
            "cuMemUnmap",
        ]
        .iter()
        .any(|prefix| api.starts_with(prefix))
        {
            Family::Vmm
        } else if api.starts_with("cuda") {
            Family::Runtime
        } else {
            Family::Driver
        }
    }
}

/// The family of every api index of every process, computed on first use.
#[derive(Default)]
pub struct FamilyCache {
    per_process: Vec<Vec<Family>>,
}

impl FamilyCache {
    /// The family of api `api` of process `process`.
    #[inline]
    pub fn of(&mut self, processes: &[crate::replay::Process], process: u32, api: u16) -> Family {
        // Every event asks: the cached answer first, without touching the cache's shape.
        match self
            .per_process
            .get(process as usize)
            .and_then(|cache| cache.get(usize::from(api)))
        {
            Some(&family) => family,
            None => self.fill(processes, process, api),
        }
    }

    /// [`FamilyCache::of`] for a process not cached yet (or an api index beyond its table).
    #[cold]
    fn fill(&mut self, processes: &[crate::replay::Process], process: u32, api: u16) -> Family {
        let index = process as usize;
        if self.per_process.len() <= index {
            self.per_process.resize(index + 1, Vec::new());
        }
        let cache = &mut self.per_process[index];
        if cache.is_empty()
            && let Some(info) = processes.get(index)
        {
            *cache = info
                .header
                .apis
                .iter()
                .map(|name| Family::of(name))
                .collect();
        }
        cache
            .get(usize::from(api))
            .copied()
            .unwrap_or(Family::Driver)
    }
}

/// File-name prefixes of NVIDIA's libraries that allocate device memory of their own.
const NVIDIA_LIBRARIES: [&str; 9] = [
    "libcublas",
    "libcudnn",
    "libnccl",
    "libcufft",
    "libcusolver",
    "libcusparse",
    "libcurand",
    "libnvshmem",
    "libcufile",
];

/// Whether the object at `path` is one of NVIDIA's libraries that allocate device memory for
/// themselves (cuBLAS, cuDNN, NCCL, ...), by its file name.
pub fn is_nvidia_library(path: &str) -> bool {
    let name = std::path::Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    NVIDIA_LIBRARIES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::Family;

    #[test]
    fn every_hooked_entry_point_has_its_family() {
        let cases = [
            ("cudaMalloc", Family::Runtime),
            ("cudaFree", Family::Runtime),
            ("cudaMallocPitch", Family::Runtime),
            ("cuMemAlloc_v2", Family::Driver),
            ("cuMemAllocPitch_v2", Family::Driver),
            ("cuArray3DCreate_v2", Family::Driver),
            ("cuMemFree_v2", Family::Driver),
            ("cudaMallocAsync_ptsz", Family::StreamOrdered),
            ("cuMemFreeAsync", Family::StreamOrdered),
            ("cudaMallocFromPoolAsync", Family::StreamOrdered),
            ("cudaMemPoolTrimTo", Family::StreamOrdered),
            ("cuMemAddressReserve", Family::Vmm),
            ("cuMemCreate", Family::Vmm),
            ("cuMemUnmap", Family::Vmm),
            ("cuMemAllocManaged", Family::Managed),
            ("cudaMallocManaged", Family::Managed),
            ("cudaMallocHost", Family::PinnedHost),
            ("cudaHostAlloc", Family::PinnedHost),
            ("cuMemHostRegister_v2", Family::PinnedHost),
            ("cuMemFreeHost", Family::PinnedHost),
            ("cudaFreeHost", Family::PinnedHost),
        ];
        for (api, family) in cases {
            assert_eq!(Family::of(api), family, "{api}");
        }
    }
}
