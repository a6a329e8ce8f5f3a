//! Offline symbolisation of the native return addresses a log records.
//!
//! The recorder stores raw return addresses plus, for each loaded object, its path, load bias,
//! address range and GNU build id (`ModuleDef`). The report turns an address back into
//! function, file and line by opening the same files on the machine that reads the log: DWARF
//! first (with inlined frames), then the symbol table, then plain `module+offset`. A file that is
//! missing, unreadable or not the one that ran (its build id differs) is never used, because
//! wrong names are worse than none; the user gets one warning for it instead.
//!
//! Offsets: a [`SymFrame::offset`] is the file-relative address of the return address itself
//! (`ip - load_bias`), like glibc's `backtrace_symbols` and perf show it; the file and line come
//! from `offset - 1`, inside the call instruction, so they name the call and not the statement
//! after it.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::debug_prefix::ObjectLoader;
use rustc_hash::FxHashMap;
use vramshim_format::ModuleDef;

/// [`SymFrame::module`] of an address that lies in no recorded module.
pub const UNKNOWN_MODULE: &str = "[unknown]";

/// Where separate debug files are looked up by build id (`<root>/.build-id/ab/cdef….debug`),
/// as distributions install them (`-dbg`, `-dbgsym`, `-debuginfo` packages).
const DEBUG_ROOT: &str = "/usr/lib/debug";

/// One symbolised frame (inlined frames expand into several, innermost first). The strings
/// are shared (`Rc`): a log's millions of stacks repeat the same few thousand of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymFrame {
    /// Function name, demangled (C++ and Rust); `None` if unknown.
    pub function: Option<Rc<str>>,
    /// Source file, the full path as DWARF gives it.
    pub file: Option<Rc<str>>,
    /// Source line of the call (for an inlined frame: where it was inlined into its caller).
    pub line: Option<u32>,
    /// Module path from the log; [`UNKNOWN_MODULE`] when the address is in no module.
    pub module: Rc<str>,
    /// `ip - load_bias`: the file-relative virtual address of the return address (not of the
    /// call: subtract 1 before handing it to `addr2line -e module`). The address itself when
    /// the module is unknown.
    pub offset: u64,
    /// True for frames that were inlined into the next one out (same return address).
    pub inlined: bool,
}

impl SymFrame {
    /// Short label for trees and flame graphs: `"func (file.c:42)"`, `"func"`, or
    /// `"libfoo.so+0x1234"` (with `" (file.c:42)"` appended when only the line is known).
    /// File and module are shortened to their last path component; the full ones stay in
    /// the fields.
    pub fn label(&self) -> String {
        let place = self.file.as_deref().map(|file| match self.line {
            Some(line) => format!("{}:{line}", base_name(file)),
            None => base_name(file).to_owned(),
        });
        let name = match &self.function {
            Some(function) => function.to_string(),
            None => format!("{}+{:#x}", module_label(&self.module), self.offset),
        };
        match place {
            Some(place) => format!("{name} ({place})"),
            None => name,
        }
    }
}

/// Turns the recorded return addresses of one process into [`SymFrame`]s, caching object files
/// and results (reports symbolise the same addresses many times).
pub struct Symbolizer {
    /// The process's modules, in log order.
    modules: Vec<ModuleDef>,
    /// Usable modules sorted by start: `(start, largest end among this and earlier entries,
    /// index into modules)`. The running maximum bounds the backwards scan when ranges overlap.
    by_start: Vec<(u64, u64, usize)>,
    /// Per module: `None` not opened yet, `Some(None)` unusable, `Some(Some(i))` = `files[i]`.
    state: Vec<Option<Option<usize>>>,
    /// Object files opened so far.
    files: Vec<ObjectFile>,
    /// Path → index into `files` (`None`: the file could not be opened; already warned).
    file_by_path: FxHashMap<String, Option<usize>>,
    /// Results per recorded address, for addresses looked up in an object file (the others
    /// cost less to redo than to keep: a log can hold tens of millions of them).
    cache: FxHashMap<u64, Vec<SymFrame>>,
    /// Per module: its path, shared by its frames.
    module_paths: Vec<Rc<str>>,
    /// [`UNKNOWN_MODULE`], shared by the frames of addresses in no module.
    unknown_module: Rc<str>,
    /// User warnings, deduplicated, in the order they arose.
    warnings: Vec<String>,
    /// Roots searched for separate debug files.
    debug_roots: Vec<PathBuf>,
}

/// One opened object file.
struct ObjectFile {
    path: String,
    /// Build id and code ranges read from the file's headers.
    elf: ElfInfo,
    /// Symbol lookup order: a separate debug file (if found) first, then the file itself.
    loaders: Vec<ObjectLoader>,
    /// Whether `loaders[0]` has DWARF.
    has_dwarf: bool,
    /// Whether the user was already warned about this file (one warning per file).
    warned: bool,
}

impl Symbolizer {
    /// A symbolizer for the modules of ONE process (addresses of different processes overlap).
    /// Nothing is opened until an address needs it.
    pub fn new(modules: Vec<ModuleDef>) -> Symbolizer {
        let mut symbolizer = Symbolizer {
            state: vec![None; modules.len()],
            modules,
            by_start: Vec::new(),
            files: Vec::new(),
            file_by_path: FxHashMap::default(),
            cache: FxHashMap::default(),
            module_paths: Vec::new(),
            unknown_module: UNKNOWN_MODULE.into(),
            warnings: Vec::new(),
            debug_roots: vec![PathBuf::from(DEBUG_ROOT)],
        };
        symbolizer.index_modules();
        symbolizer
    }

    /// How many modules the symbolizer knows.
    pub fn module_count(&self) -> usize {
        self.modules.len()
    }

    /// Adds modules defined later in the log (a streaming reader symbolises before the whole
    /// module map is known). Addresses no module held before are looked up again.
    pub fn add_modules(&mut self, modules: &[ModuleDef]) {
        if modules.is_empty() {
            return;
        }
        self.modules.extend_from_slice(modules);
        self.state.resize(self.modules.len(), None);
        self.index_modules();
        // A later module may hold an address cached as unknown, or win over an older
        // overlapping one (the one defined last wins).
        self.cache.clear();
    }

    /// Rebuilds the start-sorted index of usable modules.
    fn index_modules(&mut self) {
        let mut by_start: Vec<(u64, u64, usize)> = self
            .modules
            .iter()
            .enumerate()
            .filter(|(_, module)| module.start < module.end)
            .map(|(index, module)| (module.start, module.end, index))
            .collect();
        by_start.sort_unstable();
        let mut max_end = 0;
        for entry in &mut by_start {
            max_end = max_end.max(entry.1);
            entry.1 = max_end;
        }
        self.by_start = by_start;
        let known = self.module_paths.len();
        self.module_paths.extend(
            self.modules[known..]
                .iter()
                .map(|m| Rc::from(m.path.as_str())),
        );
    }

    /// Expands one recorded return address into frames: innermost first, inlined ones before
    /// the function they were inlined into. Never empty: an address nothing knows about gives
    /// one frame with only module and offset.
    pub fn frames(&mut self, ip: u64) -> Vec<SymFrame> {
        if let Some(frames) = self.cache.get(&ip) {
            return frames.clone();
        }
        let frames = self.symbolise(ip);
        let looked_up = self
            .module_of(ip)
            .is_some_and(|m| matches!(self.state[m], Some(Some(_))));
        if looked_up {
            self.cache.insert(ip, frames.clone());
        }
        frames
    }

    /// A whole recorded stack (innermost first), expanded and with the frames of
    /// `libvramshim.so` itself removed (the recorder's own code is noise in a report).
    pub fn stack(&mut self, ips: &[u64]) -> Vec<SymFrame> {
        let mut out = Vec::with_capacity(ips.len());
        for &ip in ips {
            let in_shim = self
                .module_of(ip)
                .is_some_and(|m| is_shim(&self.modules[m].path));
            if !in_shim {
                out.extend(self.frames(ip));
            }
        }
        out
    }

    /// Warnings for the user, at most one per module file that could not be (fully) used:
    /// missing or unreadable file, build id mismatch, addresses no debug info or symbol covers,
    /// damaged debug info. Deduplicated, in the order they arose.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Index of the module holding `ip`. Where recorded ranges overlap (an object unloaded and
    /// another loaded in its place), the one defined last in the log wins.
    fn module_of(&self, ip: u64) -> Option<usize> {
        let after = self.by_start.partition_point(|&(start, _, _)| start <= ip);
        let mut found: Option<usize> = None;
        for &(_, max_end, index) in self.by_start[..after].iter().rev() {
            if max_end <= ip {
                break;
            }
            if ip < self.modules[index].end {
                found = Some(found.map_or(index, |f| f.max(index)));
            }
        }
        found
    }

    fn symbolise(&mut self, ip: u64) -> Vec<SymFrame> {
        let Some(m) = self.module_of(ip) else {
            return vec![SymFrame {
                function: None,
                file: None,
                line: None,
                module: self.unknown_module.clone(),
                offset: ip,
                inlined: false,
            }];
        };
        let module = &self.modules[m];
        let offset = ip.wrapping_sub(module.load_bias);
        let bare = SymFrame {
            function: None,
            file: None,
            line: None,
            module: self.module_paths[m].clone(),
            offset,
            inlined: false,
        };
        let Some(f) = self.object_for(m) else {
            return vec![bare];
        };
        // A return address points after the call: look inside the call instruction.
        let probe = offset.saturating_sub(1);
        let file = &mut self.files[f];
        let mut frames = Vec::new();
        let mut warning = None;
        if !file.elf.is_code(probe) {
            // Not a return address into this object's code: nothing to look up.
            return vec![bare];
        }
        if file.has_dwarf {
            match dwarf_frames(&file.loaders[0], probe, &bare) {
                Ok(found) => frames = found,
                Err(error) => {
                    warning = Some(format!(
                        "{}: damaged debug info ({error}); some frames lack file and line",
                        file.path
                    ))
                }
            }
        }
        // DWARF without a function here (or none at all): the symbol table names it.
        if frames.last().is_none_or(|frame| frame.function.is_none()) {
            let symbol = file
                .loaders
                .iter()
                .find_map(|loader| loader.find_symbol(probe))
                .map(demangle_symbol);
            if let Some(symbol) = symbol {
                match frames.last_mut() {
                    Some(frame) => frame.function = Some(symbol.into()),
                    None => frames.push(SymFrame {
                        function: Some(symbol.into()),
                        ..bare.clone()
                    }),
                }
            }
        }
        if frames.is_empty() {
            frames.push(bare);
        }
        if warning.is_none() && frames.iter().all(|frame| frame.function.is_none()) {
            warning = Some(format!(
                "{}: no debug info or symbol covers some addresses; those frames shown as \
                 module+offset",
                file.path
            ));
        }
        if let Some(warning) = warning
            && !file.warned
        {
            file.warned = true;
            self.warn(warning);
        }
        frames
    }

    /// The opened file for module `m`, or `None` when it cannot be used (warned once).
    fn object_for(&mut self, m: usize) -> Option<usize> {
        if let Some(state) = self.state[m] {
            return state;
        }
        let state = self.resolve(m);
        self.state[m] = Some(state);
        state
    }

    fn resolve(&mut self, m: usize) -> Option<usize> {
        let path = self.modules[m].path.clone();
        if is_vdso(&path) {
            // The vDSO lives only in the kernel: there is no file to read.
            return None;
        }
        let f = match self.file_by_path.get(&path) {
            Some(&slot) => slot,
            None => {
                let slot = self.open(&path);
                self.file_by_path.insert(path.clone(), slot);
                slot
            }
        }?;
        let recorded = &self.modules[m].build_id;
        let actual = &self.files[f].elf.build_id;
        if !recorded.is_empty() && !actual.is_empty() && recorded != actual {
            self.warn(format!(
                "{path}: build id {} differs from the recorded {} (the file changed after the \
                 run); frames shown as module+offset",
                hex(actual),
                hex(recorded)
            ));
            return None;
        }
        Some(f)
    }

    /// Opens `path` and, when it has no DWARF, its separate debug file. Warns on failure.
    fn open(&mut self, path: &str) -> Option<usize> {
        let opened = open_regular(Path::new(path)).and_then(|mut file| {
            let elf = read_elf_info_from(&mut file)?;
            Ok((file, elf))
        });
        let (file, elf) = match opened {
            Ok(opened) => opened,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                self.warn(format!(
                    "{path}: file not found; frames shown as module+offset"
                ));
                return None;
            }
            Err(error) if error.kind() == io::ErrorKind::InvalidInput => {
                self.warn(format!("{path}: {error}; frames shown as module+offset"));
                return None;
            }
            Err(error) => {
                self.warn(format!(
                    "{path}: cannot read ({error}); frames shown as module+offset"
                ));
                return None;
            }
        };
        let loader = match ObjectLoader::open(file, Path::new(path)) {
            Ok(loader) => loader,
            Err(error) => {
                self.warn(format!(
                    "{path}: not a readable object file ({error}); frames shown as module+offset"
                ));
                return None;
            }
        };
        let mut loaders = vec![loader];
        let mut has_dwarf = loaders[0].has_dwarf();
        if !has_dwarf && let Some(debug) = self.separate_debug_file(&elf.build_id) {
            loaders.insert(0, debug);
            has_dwarf = true;
        }
        self.files.push(ObjectFile {
            path: path.to_owned(),
            elf,
            loaders,
            has_dwarf,
            warned: false,
        });
        Some(self.files.len() - 1)
    }

    /// The separate debug file for `build_id` under a debug root, if one with DWARF exists.
    fn separate_debug_file(&self, build_id: &[u8]) -> Option<ObjectLoader> {
        // The first byte names a directory; fewer than two bytes cannot form a name.
        let (first, rest) = build_id
            .split_first()
            .filter(|(_, rest)| !rest.is_empty())?;
        let relative = format!(".build-id/{:02x}/{}.debug", first, hex(rest));
        self.debug_roots.iter().find_map(|root| {
            let candidate = root.join(&relative);
            let file = open_regular(&candidate).ok()?;
            let loader = ObjectLoader::open(file, &candidate).ok()?;
            loader.has_dwarf().then_some(loader)
        })
    }

    fn warn(&mut self, warning: String) {
        if !self.warnings.contains(&warning) {
            self.warnings.push(warning);
        }
    }
}

/// The DWARF frames at file address `probe`, innermost first; `bare` gives module and offset.
fn dwarf_frames(
    loader: &ObjectLoader,
    probe: u64,
    bare: &SymFrame,
) -> Result<Vec<SymFrame>, Box<dyn std::error::Error>> {
    let mut frames: Vec<SymFrame> = loader
        .frames(probe)?
        .into_iter()
        .map(|frame| SymFrame {
            function: frame.function.map(Rc::from),
            file: frame.file.map(Rc::from),
            // Line 0 means "no line" in DWARF.
            line: frame.line.filter(|&line| line != 0),
            inlined: true,
            ..bare.clone()
        })
        .collect();
    // Every frame but the outermost was inlined into the one after it.
    if let Some(outer) = frames.last_mut() {
        outer.inlined = false;
    }
    Ok(frames)
}

/// A symbol-table name demangled as Rust, else C++, else kept as is.
fn demangle_symbol(name: &str) -> String {
    addr2line::demangle_auto(Cow::Borrowed(name), None).into_owned()
}

/// Whether the module is the vDSO (no file): `[vdso]`, the names glibc gives it, or no name.
fn is_vdso(path: &str) -> bool {
    path.is_empty()
        || path == "[vdso]"
        || path.starts_with("linux-vdso")
        || path == "linux-gate.so.1"
}

/// Whether the module is the recorder itself.
fn is_shim(path: &str) -> bool {
    path.ends_with("libvramshim.so")
}

/// The module's name in labels: last path component, `[vdso]` for the vDSO.
fn module_label(path: &str) -> &str {
    if is_vdso(path) {
        "[vdso]"
    } else {
        base_name(path)
    }
}

/// Last component of a path (the whole path if it ends with '/').
fn base_name(path: &str) -> &str {
    match path.rsplit('/').next() {
        Some(name) if !name.is_empty() => name,
        _ => path,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

// ELF constants needed for the build id note and the code segments.
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const PF_X: u32 = 1;
const SHT_NOTE: u32 = 7;
const NT_GNU_BUILD_ID: u32 = 3;
/// Notes larger than this are not build-id notes worth reading.
const MAX_NOTE_BYTES: u64 = 1 << 20;

/// What the symbolizer needs from an ELF file's headers.
#[derive(Debug, Default)]
struct ElfInfo {
    /// GNU build id, empty if none.
    build_id: Vec<u8>,
    /// File virtual address ranges of the executable loadable segments: return addresses lie
    /// there, so anything else is not looked up (dead code's DWARF often claims address 0).
    code: Vec<(u64, u64)>,
}

impl ElfInfo {
    /// Whether `address` may be code (always, when the headers named no code at all).
    fn is_code(&self, address: u64) -> bool {
        self.code.is_empty()
            || self
                .code
                .iter()
                .any(|&(start, end)| start <= address && address < end)
    }
}

/// Build id and code ranges of the ELF file at `path`; empty if it is not ELF or the headers
/// are damaged (the loader then reports the file). Errors only when the file cannot be opened
/// or read.
#[cfg(test)]
fn read_elf_info(path: &Path) -> io::Result<ElfInfo> {
    read_elf_info_from(&mut open_regular(path)?)
}

/// [`read_elf_info`] of a file already opened.
fn read_elf_info_from(file: &mut File) -> io::Result<ElfInfo> {
    let len = file.metadata()?.len();
    let mut reader = ElfReader {
        file,
        len,
        big_endian: false,
        wide: false,
    };
    let mut info = ElfInfo::default();
    let Some(header) = reader.read_at(0, 64)? else {
        return Ok(info);
    };
    if header[..4] != *b"\x7fELF" {
        return Ok(info);
    }
    reader.wide = match header[4] {
        1 => false,
        2 => true,
        _ => return Ok(info),
    };
    reader.big_endian = match header[5] {
        1 => false,
        2 => true,
        _ => return Ok(info),
    };
    // Program headers first: the PT_NOTE segments are what the recorder read in memory.
    let (phoff, phentsize, phnum) = if reader.wide {
        (
            reader.u64(&header, 0x20),
            reader.u16(&header, 0x36),
            reader.u16(&header, 0x38),
        )
    } else {
        (
            reader.u32(&header, 0x1c).into(),
            reader.u16(&header, 0x2a),
            reader.u16(&header, 0x2c),
        )
    };
    let mut notes = Vec::new();
    for i in 0..u64::from(phnum) {
        let at = phoff.saturating_add(i * u64::from(phentsize));
        let Some(entry) = reader.read_at(at, if reader.wide { 56 } else { 32 })? else {
            break;
        };
        // (type, flags, offset, vaddr, filesz, memsz, align)
        let (kind, flags, offset, vaddr, filesz, memsz, align) = if reader.wide {
            (
                reader.u32(&entry, 0),
                reader.u32(&entry, 4),
                reader.u64(&entry, 8),
                reader.u64(&entry, 16),
                reader.u64(&entry, 32),
                reader.u64(&entry, 40),
                reader.u64(&entry, 48),
            )
        } else {
            (
                reader.u32(&entry, 0),
                reader.u32(&entry, 24),
                reader.u32(&entry, 4).into(),
                reader.u32(&entry, 8).into(),
                reader.u32(&entry, 16).into(),
                reader.u32(&entry, 20).into(),
                reader.u32(&entry, 28).into(),
            )
        };
        match kind {
            PT_LOAD if flags & PF_X != 0 => {
                info.code.push((vaddr, vaddr.saturating_add(memsz)));
            }
            PT_NOTE => notes.push((offset, filesz, align)),
            _ => {}
        }
    }
    for (offset, size, align) in notes {
        if let Some(id) = reader.build_id_in(offset, size, align)? {
            info.build_id = id;
            return Ok(info);
        }
    }
    // Then note sections (separate debug files keep them, not always as segments).
    let (shoff, shentsize, shnum) = if reader.wide {
        (
            reader.u64(&header, 0x28),
            reader.u16(&header, 0x3a),
            reader.u16(&header, 0x3c),
        )
    } else {
        (
            reader.u32(&header, 0x20).into(),
            reader.u16(&header, 0x2e),
            reader.u16(&header, 0x30),
        )
    };
    for i in 0..u64::from(shnum) {
        let at = shoff.saturating_add(i * u64::from(shentsize));
        let Some(entry) = reader.read_at(at, if reader.wide { 64 } else { 40 })? else {
            break;
        };
        if reader.u32(&entry, 4) != SHT_NOTE {
            continue;
        }
        let (offset, size, align) = if reader.wide {
            (
                reader.u64(&entry, 24),
                reader.u64(&entry, 32),
                reader.u64(&entry, 48),
            )
        } else {
            (
                reader.u32(&entry, 16).into(),
                reader.u32(&entry, 20).into(),
                reader.u32(&entry, 32).into(),
            )
        };
        if let Some(id) = reader.build_id_in(offset, size, align)? {
            info.build_id = id;
            return Ok(info);
        }
    }
    Ok(info)
}

/// Opens `path` for reading if it is a regular file. Paths come from logs, so they may name a
/// FIFO (whose open or read would block forever), a device node (whose open may act on the
/// device) or a directory: those are refused with an `InvalidInput` error that says what the
/// path is. The type is checked before opening, so special files are never opened, and again
/// on the open file, in case the path changed in between; the open never blocks.
fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    refuse_special(&std::fs::metadata(path)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    refuse_special(&file.metadata()?)?;
    Ok(file)
}

/// An `InvalidInput` error unless `metadata` is a regular file's.
fn refuse_special(metadata: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let kind = metadata.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({what})"),
    ))
}

/// Bounds-checked reads of an ELF file of either class and byte order.
struct ElfReader<'a> {
    file: &'a mut File,
    len: u64,
    big_endian: bool,
    /// ELFCLASS64.
    wide: bool,
}

impl ElfReader<'_> {
    /// `size` bytes at `offset`, or `None` when they lie (partly) beyond the end of the file.
    fn read_at(&mut self, offset: u64, size: u64) -> io::Result<Option<Vec<u8>>> {
        if offset.checked_add(size).is_none_or(|end| end > self.len) {
            return Ok(None);
        }
        self.file.seek(SeekFrom::Start(offset))?;
        let mut bytes = vec![0; size as usize];
        match self.file.read_exact(&mut bytes) {
            Ok(()) => Ok(Some(bytes)),
            // The file shrank under us: treat it as short, not as unreadable.
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The build id in the note area at `offset`, `size` bytes, if there is one.
    fn build_id_in(&mut self, offset: u64, size: u64, align: u64) -> io::Result<Option<Vec<u8>>> {
        if size > MAX_NOTE_BYTES {
            return Ok(None);
        }
        let Some(notes) = self.read_at(offset, size)? else {
            return Ok(None);
        };
        // Notes are 4-byte aligned, except in areas explicitly aligned to 8.
        let align = if align == 8 { 8 } else { 4 };
        let mut at = 0usize;
        while at + 12 <= notes.len() {
            let name_size = self.u32(&notes, at) as usize;
            let desc_size = self.u32(&notes, at + 4) as usize;
            let kind = self.u32(&notes, at + 8);
            let name_at = at + 12;
            let Some(desc_at) = name_at.checked_add(name_size.next_multiple_of(align)) else {
                break;
            };
            let Some(next) = desc_at.checked_add(desc_size.next_multiple_of(align)) else {
                break;
            };
            if desc_at
                .checked_add(desc_size)
                .is_none_or(|end| end > notes.len())
            {
                break;
            }
            if kind == NT_GNU_BUILD_ID && notes[name_at..name_at + name_size] == *b"GNU\0" {
                return Ok(Some(notes[desc_at..desc_at + desc_size].to_vec()));
            }
            at = next;
        }
        Ok(None)
    }

    // Field readers: callers pass slices long enough for the field (fixed header sizes).
    fn u16(&self, bytes: &[u8], at: usize) -> u16 {
        let raw = [bytes[at], bytes[at + 1]];
        if self.big_endian {
            u16::from_be_bytes(raw)
        } else {
            u16::from_le_bytes(raw)
        }
    }

    fn u32(&self, bytes: &[u8], at: usize) -> u32 {
        let mut raw = [0; 4];
        raw.copy_from_slice(&bytes[at..at + 4]);
        if self.big_endian {
            u32::from_be_bytes(raw)
        } else {
            u32::from_le_bytes(raw)
        }
    }

    fn u64(&self, bytes: &[u8], at: usize) -> u64 {
        let mut raw = [0; 8];
        raw.copy_from_slice(&bytes[at..at + 8]);
        if self.big_endian {
            u64::from_be_bytes(raw)
        } else {
            u64::from_le_bytes(raw)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;
    use std::hint::black_box;

    use super::*;

    /// The modules of this test process, as the recorder collects them (dl_iterate_phdr, build
    /// id read from the loaded PT_NOTE segments, main program named by /proc/self/exe).
    fn loaded_modules() -> Vec<ModuleDef> {
        unsafe extern "C" fn each(
            info: *mut libc::dl_phdr_info,
            _size: usize,
            data: *mut c_void,
        ) -> i32 {
            let found = unsafe { &mut *(data as *mut Vec<ModuleDef>) };
            let info = unsafe { &*info };
            let (mut start, mut end, mut build_id) = (u64::MAX, 0u64, Vec::new());
            for i in 0..usize::from(info.dlpi_phnum) {
                let phdr = unsafe { &*info.dlpi_phdr.add(i) };
                let seg_start = info.dlpi_addr.wrapping_add(phdr.p_vaddr);
                if phdr.p_type == libc::PT_LOAD {
                    start = start.min(seg_start);
                    end = end.max(seg_start + phdr.p_memsz);
                } else if phdr.p_type == libc::PT_NOTE && build_id.is_empty() {
                    let notes = unsafe {
                        std::slice::from_raw_parts(seg_start as *const u8, phdr.p_memsz as usize)
                    };
                    build_id = memory_build_id(notes);
                }
            }
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
                    .to_string_lossy()
                    .into_owned()
            };
            let path = if name.is_empty() {
                std::fs::read_link("/proc/self/exe")
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default()
            } else {
                name
            };
            if start < end {
                found.push(ModuleDef {
                    path,
                    load_bias: info.dlpi_addr,
                    start,
                    end,
                    build_id,
                });
            }
            0
        }
        let mut found: Vec<ModuleDef> = Vec::new();
        unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut found).cast::<c_void>()) };
        found
    }

    /// The build id in a note area already in memory (independent of the file parser).
    fn memory_build_id(notes: &[u8]) -> Vec<u8> {
        let word = |at: usize| u32::from_ne_bytes(notes[at..at + 4].try_into().unwrap()) as usize;
        let mut at = 0;
        while at + 12 <= notes.len() {
            let (name_size, desc_size, kind) = (word(at), word(at + 4), word(at + 8));
            let desc_at = at + 12 + name_size.next_multiple_of(4);
            if desc_at + desc_size > notes.len() {
                break;
            }
            if kind == 3 && notes[at + 12..at + 12 + name_size] == *b"GNU\0" {
                return notes[desc_at..desc_at + desc_size].to_vec();
            }
            at = desc_at + desc_size.next_multiple_of(4);
        }
        Vec::new()
    }

    /// The test binary's own module.
    fn own_module(modules: &[ModuleDef]) -> ModuleDef {
        let here = own_module as *const () as u64;
        modules
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .expect("the test binary is among the loaded modules")
            .clone()
    }

    #[inline(never)]
    fn symbolise_me_target(x: u64) -> u64 {
        black_box(x).wrapping_mul(3)
    }

    unsafe extern "C" {
        /// glibc: fills `buffer` with return addresses, innermost first.
        fn backtrace(buffer: *mut *mut c_void, size: i32) -> i32;
    }

    #[inline(never)]
    fn capture_return_addresses() -> Vec<u64> {
        let mut buffer = [std::ptr::null_mut::<c_void>(); 64];
        let count = unsafe { backtrace(buffer.as_mut_ptr(), 64) };
        buffer[..count.max(0) as usize]
            .iter()
            .map(|&ip| ip as u64)
            .collect()
    }

    #[inline(never)]
    fn symbolise_me_caller() -> (Vec<u64>, u32) {
        // One line: the call and line!() must share it.
        (capture_return_addresses(), line!())
    }

    #[inline(always)]
    fn symbolise_me_inlined() -> (Vec<u64>, u32) {
        // One line: the call and line!() must share it.
        (capture_return_addresses(), line!())
    }

    #[inline(never)]
    fn symbolise_me_outer() -> ((Vec<u64>, u32), u32) {
        // One line: the call and line!() must share it.
        (symbolise_me_inlined(), line!())
    }

    #[test]
    fn symbols_function_address_gives_its_name_file_and_line() {
        let modules = loaded_modules();
        let module = own_module(&modules);
        let mut symbolizer = Symbolizer::new(modules);
        let addr = symbolise_me_target as *const () as u64;
        // As if a call had returned to the function's first byte + 1.
        let frames = symbolizer.frames(addr + 1);
        let frame = frames.last().unwrap();
        assert!(
            frame
                .function
                .as_deref()
                .is_some_and(|f| f.contains("symbolise_me_target")),
            "{frames:?}"
        );
        assert!(
            !frame.function.as_deref().unwrap().contains("17h"),
            "hash kept: {frame:?}"
        );
        assert!(
            frame
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbols.rs")),
            "{frame:?}"
        );
        assert!(frame.line.is_some(), "{frame:?}");
        assert!(!frame.inlined);
        assert_eq!(*frame.module, *module.path);
        assert_eq!(frame.offset, addr + 1 - module.load_bias);
        assert!(
            frame
                .label()
                .starts_with(frame.function.as_deref().unwrap())
        );
        assert!(frame.label().contains("(symbols.rs:"), "{}", frame.label());
        assert!(
            symbolizer
                .warnings()
                .iter()
                .all(|w| !w.contains(&module.path)),
            "{:?}",
            symbolizer.warnings()
        );
        // Cached: the same answer again.
        assert_eq!(symbolizer.frames(addr + 1), frames);
    }

    #[test]
    fn symbols_modules_defined_later_are_used_from_then_on() {
        // `export` symbolises while the replay runs, before later modules are defined: a
        // module added afterwards must be found, and an address first seen as unknown must be
        // looked up again.
        let modules = loaded_modules();
        let module = own_module(&modules);
        let others: Vec<ModuleDef> = modules.iter().filter(|m| **m != module).cloned().collect();
        let mut symbolizer = Symbolizer::new(others);
        let count = symbolizer.module_count();
        let addr = symbolise_me_target as *const () as u64 + 1;
        assert_eq!(&*symbolizer.frames(addr)[0].module, UNKNOWN_MODULE);
        symbolizer.add_modules(std::slice::from_ref(&module));
        assert_eq!(symbolizer.module_count(), count + 1);
        let frames = symbolizer.frames(addr);
        let frame = frames.last().unwrap();
        assert_eq!(*frame.module, *module.path);
        assert!(
            frame
                .function
                .as_deref()
                .is_some_and(|f| f.contains("symbolise_me_target")),
            "{frames:?}"
        );
    }

    #[test]
    fn symbols_return_address_gives_the_line_of_the_call() {
        let (ips, line) = symbolise_me_caller();
        let mut symbolizer = Symbolizer::new(loaded_modules());
        let stack = symbolizer.stack(&ips);
        let frame = stack
            .iter()
            .find(|f| {
                f.function
                    .as_deref()
                    .is_some_and(|f| f.contains("symbolise_me_caller"))
            })
            .unwrap_or_else(|| panic!("caller not in {stack:#?}"));
        assert_eq!(frame.line, Some(line), "{stack:#?}");
        assert!(
            frame
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbols.rs"))
        );
        // The stack continues outwards into the test harness.
        let at = stack.iter().position(|f| f == frame).unwrap();
        assert!(stack[at + 1..].iter().any(|f| {
            f.function
                .as_deref()
                .is_some_and(|f| f.contains("symbols_return_address_gives_the_line_of_the_call"))
        }));
    }

    #[test]
    fn symbols_inlined_calls_expand_innermost_first() {
        let ((ips, inner_line), outer_line) = symbolise_me_outer();
        let mut symbolizer = Symbolizer::new(loaded_modules());
        let stack = symbolizer.stack(&ips);
        let inner = stack
            .iter()
            .position(|f| {
                f.function
                    .as_deref()
                    .is_some_and(|f| f.contains("symbolise_me_inlined"))
            })
            .unwrap_or_else(|| panic!("inlined function not in {stack:#?}"));
        assert!(stack[inner].inlined, "{stack:#?}");
        assert_eq!(stack[inner].line, Some(inner_line), "{stack:#?}");
        let outer = &stack[inner + 1];
        assert!(
            outer
                .function
                .as_deref()
                .is_some_and(|f| f.contains("symbolise_me_outer")),
            "{stack:#?}"
        );
        assert!(!outer.inlined);
        assert_eq!(outer.line, Some(outer_line), "{stack:#?}");
        // Both come from the same return address.
        assert_eq!(outer.offset, stack[inner].offset);
    }

    #[test]
    fn symbols_missing_file_gives_module_offset_and_one_warning() {
        let modules = vec![ModuleDef {
            path: "/nonexistent/dir/libgone.so".into(),
            load_bias: 0x7000_0000,
            start: 0x7000_1000,
            end: 0x7000_9000,
            build_id: vec![1, 2, 3, 4],
        }];
        let mut symbolizer = Symbolizer::new(modules);
        let frames = symbolizer.frames(0x7000_1234);
        assert_eq!(
            frames,
            vec![SymFrame {
                function: None,
                file: None,
                line: None,
                module: "/nonexistent/dir/libgone.so".into(),
                offset: 0x1234,
                inlined: false,
            }]
        );
        assert_eq!(frames[0].label(), "libgone.so+0x1234");
        symbolizer.frames(0x7000_2000);
        assert_eq!(
            symbolizer.warnings(),
            vec!["/nonexistent/dir/libgone.so: file not found; frames shown as module+offset"]
        );
    }

    #[test]
    fn symbols_build_id_mismatch_is_not_trusted() {
        let modules = loaded_modules();
        let mut module = own_module(&modules);
        let real_id = read_elf_info(Path::new(&module.path)).unwrap().build_id;
        assert!(!real_id.is_empty(), "the test binary has a build id");
        module.build_id = real_id.iter().map(|b| !b).collect();
        let mut symbolizer = Symbolizer::new(vec![module.clone()]);
        let addr = symbolise_me_target as *const () as u64;
        let frames = symbolizer.frames(addr + 1);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].function, None);
        assert_eq!(frames[0].file, None);
        let name = base_name(&module.path);
        assert_eq!(
            frames[0].label(),
            format!("{name}+{:#x}", addr + 1 - module.load_bias)
        );
        let warnings = symbolizer.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(&format!("{}: build id ", module.path)),
            "{warnings:?}"
        );
        assert!(warnings[0].contains(&hex(&real_id)), "{warnings:?}");
    }

    #[test]
    fn symbols_file_build_id_matches_the_loaded_one() {
        // Every loaded object with a file: the file parser agrees with the in-memory notes.
        let mut checked = 0;
        for module in loaded_modules() {
            if is_vdso(&module.path) || module.build_id.is_empty() {
                continue;
            }
            let Ok(from_file) = read_elf_info(Path::new(&module.path)).map(|elf| elf.build_id)
            else {
                continue;
            };
            assert_eq!(from_file, module.build_id, "{}", module.path);
            checked += 1;
        }
        assert!(checked >= 2, "the test binary and libc at least");
        assert_eq!(
            read_elf_info(Path::new("/nonexistent/x"))
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
        // Not ELF: no id, no error (the loader then reports the file).
        let text =
            std::env::temp_dir().join(format!("vramshim-symbols-{}.txt", std::process::id()));
        std::fs::write(&text, b"\x7fELF but not really").unwrap();
        let elf = read_elf_info(&text).unwrap();
        assert!(elf.build_id.is_empty() && elf.code.is_empty());
        let mut symbolizer = Symbolizer::new(vec![ModuleDef {
            path: text.to_string_lossy().into_owned(),
            load_bias: 0,
            start: 0x1000,
            end: 0x2000,
            build_id: Vec::new(),
        }]);
        assert_eq!(
            symbolizer.frames(0x1010)[0].label(),
            format!("{}+0x1010", base_name(&text.to_string_lossy()))
        );
        let warnings = symbolizer.warnings();
        std::fs::remove_file(&text).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("not a readable object file"),
            "{warnings:?}"
        );
    }

    #[test]
    fn symbols_unknown_address_and_vdso() {
        let mut symbolizer = Symbolizer::new(vec![
            ModuleDef {
                path: "[vdso]".into(),
                load_bias: 0x7fff_0000,
                start: 0x7fff_0000,
                end: 0x7fff_2000,
                build_id: vec![9; 20],
            },
            ModuleDef {
                path: "".into(),
                load_bias: 0x5000,
                start: 0x5000,
                end: 0x6000,
                build_id: Vec::new(),
            },
        ]);
        let unknown = symbolizer.frames(0x10);
        assert_eq!(unknown.len(), 1);
        assert_eq!(&*unknown[0].module, UNKNOWN_MODULE);
        assert_eq!(unknown[0].function, None);
        assert_eq!(unknown[0].offset, 0x10);
        assert_eq!(unknown[0].label(), "[unknown]+0x10");
        // End of a range is outside it.
        assert_eq!(&*symbolizer.frames(0x7fff_2000)[0].module, UNKNOWN_MODULE);
        assert_eq!(symbolizer.frames(0x7fff_0abc)[0].label(), "[vdso]+0xabc");
        assert_eq!(symbolizer.frames(0x5010)[0].label(), "[vdso]+0x10");
        // No file to read is not worth a warning.
        assert_eq!(symbolizer.warnings(), Vec::<String>::new());
    }

    #[test]
    fn symbols_stack_drops_the_recorder_and_picks_the_right_module() {
        let mut modules = loaded_modules();
        let module = own_module(&modules);
        modules.push(ModuleDef {
            path: "/opt/vramshim/lib/libvramshim.so".into(),
            load_bias: 0x1000,
            start: 0x1000,
            end: 0x3000,
            build_id: Vec::new(),
        });
        // Overlaps the recorder's range; defined later, so it wins there.
        modules.push(ModuleDef {
            path: "/nonexistent/libover.so".into(),
            load_bias: 0x2000,
            start: 0x2000,
            end: 0x2800,
            build_id: Vec::new(),
        });
        let mut symbolizer = Symbolizer::new(modules);
        let addr = symbolise_me_target as *const () as u64 + 1;
        let stack = symbolizer.stack(&[0x1100, 0x2100, 0x1200, addr, 0x2900, 0x10]);
        let labels: Vec<String> = stack.iter().map(SymFrame::label).collect();
        // The middle address may expand into inlined frames (black_box, optimised builds).
        let own = &stack[1..stack.len() - 1];
        assert_eq!(labels[0], "libover.so+0x100", "{labels:?}");
        assert!(!own.is_empty(), "{labels:?}");
        assert!(own.iter().all(|f| *f.module == *module.path), "{labels:?}");
        let outer = own.last().unwrap();
        assert!(has_function(outer, "symbolise_me_target"), "{labels:?}");
        assert!(!outer.inlined && own[..own.len() - 1].iter().all(|f| f.inlined));
        assert_eq!(labels.last().unwrap(), "[unknown]+0x10");
        // frames() itself still shows the recorder.
        assert_eq!(symbolizer.frames(0x1100)[0].label(), "libvramshim.so+0x100");
    }

    #[test]
    fn symbols_address_outside_code_is_not_looked_up() {
        // The ELF header at the very start of the test binary: not code, although the DWARF
        // of functions the linker dropped may claim it (their address became 0).
        let modules = loaded_modules();
        let module = own_module(&modules);
        let mut symbolizer = Symbolizer::new(vec![module.clone()]);
        let frames = symbolizer.frames(module.start + 0x11);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].function, None, "{frames:?}");
        assert_eq!(frames[0].file, None, "{frames:?}");
        assert_eq!(
            frames[0].label(),
            format!(
                "{}+{:#x}",
                base_name(&module.path),
                module.start + 0x11 - module.load_bias
            )
        );
        // Not a damaged or stripped file: nothing to warn about.
        assert_eq!(symbolizer.warnings(), Vec::<String>::new());
    }

    #[test]
    fn symbols_labels() {
        let mut frame = SymFrame {
            function: Some("at::empty(c10::ArrayRef<long>)".into()),
            file: Some("/src/aten/empty.cpp".into()),
            line: Some(42),
            module: "/usr/lib/libtorch_cpu.so".into(),
            offset: 0x1234,
            inlined: false,
        };
        assert_eq!(
            frame.label(),
            "at::empty(c10::ArrayRef<long>) (empty.cpp:42)"
        );
        frame.line = None;
        assert_eq!(frame.label(), "at::empty(c10::ArrayRef<long>) (empty.cpp)");
        frame.file = None;
        assert_eq!(frame.label(), "at::empty(c10::ArrayRef<long>)");
        frame.function = None;
        assert_eq!(frame.label(), "libtorch_cpu.so+0x1234");
        frame.file = Some("kernel.cu".into());
        frame.line = Some(7);
        assert_eq!(frame.label(), "libtorch_cpu.so+0x1234 (kernel.cu:7)");
    }

    #[test]
    fn symbols_symbol_table_names_are_demangled() {
        assert_eq!(demangle_symbol("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle_symbol("_ZN8vramshim7symbols4test17h0123456789abcdefE"),
            "vramshim::symbols::test"
        );
        assert_eq!(demangle_symbol("cuMemAlloc_v2"), "cuMemAlloc_v2");
    }

    /// Removes a scratch directory even when the test fails.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn objcopy(args: &[&std::ffi::OsStr]) -> bool {
        std::process::Command::new("objcopy")
            .args(args)
            .status()
            .is_ok_and(|status| status.success())
    }

    fn has_function(frame: &SymFrame, name: &str) -> bool {
        frame.function.as_deref().is_some_and(|f| f.contains(name))
    }

    /// Copies of the test binary without DWARF (symbols kept) and without anything, plus its
    /// DWARF as a separate debug file under a build-id tree: the symbol table, the debug file
    /// and the "nothing covers it" warning.
    #[test]
    fn symbols_stripped_files_and_separate_debug_file() {
        let modules = loaded_modules();
        let module = own_module(&modules);
        let build_id = read_elf_info(Path::new(&module.path)).unwrap().build_id;
        assert!(build_id.len() >= 2);
        let dir = Scratch(
            std::env::temp_dir().join(format!("vramshim-symbols-debug-{}", std::process::id())),
        );
        let debug_dir = dir.0.join(format!(".build-id/{:02x}", build_id[0]));
        std::fs::create_dir_all(&debug_dir).unwrap();
        let debug = debug_dir.join(format!("{}.debug", hex(&build_id[1..])));
        let no_dwarf = dir.0.join("no-dwarf");
        let bare = dir.0.join("bare");
        let exe: &std::ffi::OsStr = module.path.as_ref();
        let made = objcopy(&["--only-keep-debug".as_ref(), exe, debug.as_os_str()])
            && objcopy(&["--strip-debug".as_ref(), exe, no_dwarf.as_os_str()])
            && objcopy(&["--strip-all".as_ref(), exe, bare.as_os_str()]);
        if !made {
            eprintln!("objcopy unavailable: stripped-file tests skipped");
            return;
        }
        let addr = symbolise_me_target as *const () as u64 + 1;
        let copy = |path: &Path| ModuleDef {
            path: path.to_string_lossy().into_owned(),
            ..module.clone()
        };
        // No DWARF, no debug root: the symbol table names the function; no file or line.
        let mut plain = Symbolizer::new(vec![copy(&no_dwarf)]);
        plain.debug_roots = Vec::new();
        let frame = plain.frames(addr).pop().unwrap();
        assert!(has_function(&frame, "symbolise_me_target"), "{frame:?}");
        assert_eq!((&frame.file, frame.line), (&None, None), "{frame:?}");
        assert_eq!(plain.warnings(), Vec::<String>::new());
        // With the debug root: file and line again, from the debug file.
        let mut with_debug = Symbolizer::new(vec![copy(&no_dwarf)]);
        with_debug.debug_roots = vec![dir.0.clone()];
        let frame = with_debug.frames(addr).pop().unwrap();
        assert!(has_function(&frame, "symbolise_me_target"), "{frame:?}");
        assert!(
            frame
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbols.rs")),
            "{frame:?}"
        );
        assert_eq!(with_debug.warnings(), Vec::<String>::new());
        // Nothing at all (an executable exports no functions): module+offset, one warning.
        let mut stripped = Symbolizer::new(vec![copy(&bare)]);
        stripped.debug_roots = Vec::new();
        let frames = stripped.frames(addr);
        assert_eq!(frames.len(), 1);
        assert_eq!(
            frames[0].label(),
            format!("bare+{:#x}", addr - module.load_bias)
        );
        stripped.frames(symbolise_me_caller as *const () as u64 + 1);
        let warnings = stripped.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(&format!("{}: no debug info or symbol", bare.display())),
            "{warnings:?}"
        );
    }
}
