//! One object file's symbols and DWARF, read only as far as the addresses asked for need.
//!
//! `addr2line::Loader` inflates every DWARF section and parses the header of every unit when it
//! opens a file: for libc's separate debug file that is ~250 M instructions, spent even for a log
//! whose stacks touch two libc functions. Here `.debug_aranges` says which units hold an address;
//! `.debug_info` is inflated only up to the end of those units (more later if later addresses need
//! it) and `addr2line`'s context is built on that prefix. Location lists and macros, which
//! symbolising never reads, are not loaded at all.
//!
//! The answers are the full loader's: whenever the prefix cannot answer exactly the full
//! `addr2line::Loader` is opened and asked instead (address not in `.debug_aranges`, a
//! reference into a unit beyond the prefix, split DWARF, any error). The one assumption is
//! DWARF's own: a unit listed in `.debug_aranges` lists all of its code there, so no unit
//! beyond the prefix (none that `.debug_aranges` names for the address) holds it.

use std::cell::{OnceCell, RefCell};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use addr2line::{Context, FrameIter, Loader, LookupResult};
use gimli::{EndianRcSlice, RunTimeEndian, SectionId};
use memmap2::Mmap;
use object::{CompressionFormat, Object, ObjectSection};

type Reader = EndianRcSlice<RunTimeEndian>;
type BoxError = Box<dyn std::error::Error>;

/// One opened object file (the file itself or its separate debug file).
pub(crate) struct ObjectLoader {
    /// Kept open: the full loader reopens the same file through `/proc/self/fd`.
    file: File,
    /// The path to open when `/proc` is not mounted.
    path: PathBuf,
    map: Mmap,
    has_dwarf: bool,
    /// `addr2line`'s loader over the whole file, opened on first need.
    full: OnceCell<Result<Loader, String>>,
    /// The DWARF prefix, set up on first lookup (`None` inside: the file has no usable
    /// `.debug_aranges`, every lookup goes to the full loader).
    prefix: OnceCell<Option<RefCell<Prefix>>>,
    /// The symbol table, read on first need.
    symbols: OnceCell<Symbols>,
}

/// A file's symbol table as `addr2line::Loader` reads it (`object`'s symbol map), names kept
/// as places in the mapped file.
struct Symbols {
    /// (address, size, name start in the map, name length), sorted by address.
    entries: Vec<(u64, u64, usize, usize)>,
}

impl ObjectLoader {
    /// Maps `file` and checks that it is an object file; reads nothing else yet.
    pub(crate) fn open(file: File, path: &Path) -> Result<ObjectLoader, BoxError> {
        // SAFETY: the mapping is only read; the file is a regular file opened by us (a
        // concurrent writer can change what we read, as with any read, but not memory safety
        // beyond what addr2line's own loader, which maps files the same way, accepts).
        let map = unsafe { Mmap::map(&file)? };
        let object = object::File::parse(&*map)?;
        let has_dwarf = [&b".debug_info"[..], b".zdebug_info"].iter().any(|name| {
            object
                .section_by_name_bytes(name)
                .is_some_and(|section| section.size() > 0)
        });
        Ok(ObjectLoader {
            file,
            path: path.to_owned(),
            map,
            has_dwarf,
            full: OnceCell::new(),
            prefix: OnceCell::new(),
            symbols: OnceCell::new(),
        })
    }

    /// Whether the file carries DWARF (plain or GNU-compressed sections).
    pub(crate) fn has_dwarf(&self) -> bool {
        self.has_dwarf
    }

    /// The symbol-table name of the function holding `probe` (what
    /// `addr2line::Loader::find_symbol` answers, without loading any DWARF).
    pub(crate) fn find_symbol(&self, probe: u64) -> Option<&str> {
        let symbols = self.symbols.get_or_init(|| self.read_symbols());
        let index = match symbols
            .entries
            .binary_search_by_key(&probe, |&(address, ..)| address)
        {
            Ok(index) => index,
            Err(index) => index.checked_sub(1)?,
        };
        let &(address, size, start, len) = symbols.entries.get(index)?;
        if size != 0 && probe.wrapping_sub(address) >= size {
            return None;
        }
        std::str::from_utf8(self.map.get(start..start.checked_add(len)?)?).ok()
    }

    fn read_symbols(&self) -> Symbols {
        let Ok(object) = object::File::parse(&*self.map) else {
            return Symbols {
                entries: Vec::new(),
            };
        };
        let base = self.map.as_ptr() as usize;
        let entries = object
            .symbol_map()
            .symbols()
            .iter()
            .map(|symbol| {
                let name = symbol.name();
                let start = (name.as_ptr() as usize).wrapping_sub(base);
                (symbol.address(), symbol.size(), start, name.len())
            })
            .collect();
        Symbols { entries }
    }

    /// The frames (innermost first) of `probe`, exactly as `addr2line::Loader::find_frames`
    /// gives them.
    pub(crate) fn frames(&self, probe: u64) -> Result<Vec<DwarfFrame>, BoxError> {
        // Once the full loader had to be opened, it answers everything: it costs no more.
        if let Some(Ok(full)) = self.full.get() {
            return collect_frames(full.find_frames(probe)?);
        }
        if let Some(prefix) = self.prefix.get_or_init(|| self.start_prefix())
            && let Some(found) = prefix.borrow_mut().frames(probe, &self.map)
        {
            return Ok(found);
        }
        let full = self.full().map_err(|error| -> BoxError { error.into() })?;
        collect_frames(full.find_frames(probe)?)
    }

    fn full(&self) -> Result<&Loader, &str> {
        self.full
            .get_or_init(|| {
                use std::os::fd::AsRawFd;
                let by_descriptor =
                    PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
                let path = if by_descriptor.exists() {
                    &by_descriptor
                } else {
                    &self.path
                };
                Loader::new(path).map_err(|error| error.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }

    fn start_prefix(&self) -> Option<RefCell<Prefix>> {
        if !self.has_dwarf {
            return None;
        }
        Prefix::new(&self.map).ok().flatten().map(RefCell::new)
    }
}

/// One frame as DWARF gives it.
pub(crate) struct DwarfFrame {
    /// Demangled function name.
    pub(crate) function: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) line: Option<u32>,
}

fn collect_frames<R: gimli::Reader>(
    mut iter: FrameIter<'_, R>,
) -> Result<Vec<DwarfFrame>, BoxError> {
    let mut frames = Vec::new();
    while let Some(frame) = iter.next()? {
        let function = frame
            .function
            .as_ref()
            .and_then(|name| name.demangle().ok())
            .map(|name| name.into_owned());
        let (file, line) = match &frame.location {
            Some(location) => (location.file.map(str::to_owned), location.line),
            None => (None, None),
        };
        frames.push(DwarfFrame {
            function,
            file,
            line,
        });
    }
    Ok(frames)
}

/// The sections but `.debug_info`, `.debug_abbrev` and `.debug_line`, loaded whole;
/// `.debug_info` up to a unit boundary; `.debug_abbrev` and `.debug_line` as far as the
/// prefix's units read them (their abbreviation tables, their line programs).
struct Prefix {
    endian: RunTimeEndian,
    /// Every section symbolising reads, `.debug_info`, `.debug_abbrev` and `.debug_line`
    /// left empty.
    sections: Vec<(SectionId, Reader)>,
    /// `.debug_aranges` entries: (begin, end, offset of the unit in `.debug_info`).
    aranges: Vec<(u64, u64, u64)>,
    info: InfoBytes,
    /// `.debug_abbrev` and `.debug_line`, inflated on demand (`None`: the file has none). In
    /// libc's debug file they are five sixths of what the other sections inflate to.
    abbrev: Option<InfoBytes>,
    line: Option<InfoBytes>,
    /// Bytes of `.debug_info` the context covers (a unit boundary).
    covered: usize,
    context: Option<Context<Reader>>,
}

impl Prefix {
    /// `None` when the file has no `.debug_aranges` (or an empty one): nothing to steer by.
    fn new(map: &Mmap) -> Result<Option<Prefix>, BoxError> {
        let object = object::File::parse(&**map)?;
        let endian = if object.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let mut sections = Vec::new();
        let (mut abbrev, mut line) = (None, None);
        for id in NEEDED {
            let data = match section_named(&object, id) {
                Some(section) if matches!(id, SectionId::DebugAbbrev | SectionId::DebugLine) => {
                    let lazy = Some(InfoBytes::new(section.compressed_data()?, map, endian)?);
                    match id {
                        SectionId::DebugAbbrev => abbrev = lazy,
                        _ => line = lazy,
                    }
                    continue;
                }
                Some(section) => section.uncompressed_data()?.into_owned(),
                None => Vec::new(),
            };
            sections.push((id, Reader::new(Rc::from(data), endian)));
        }
        let aranges_data = sections
            .iter()
            .find(|(id, _)| *id == SectionId::DebugAranges)
            .map(|(_, data)| data.clone())
            .unwrap_or_else(|| Reader::new(Rc::from(Vec::new()), endian));
        let mut aranges = Vec::new();
        let mut headers = gimli::DebugAranges::from(aranges_data).headers();
        while let Some(header) = headers.next()? {
            let unit = header.debug_info_offset().0 as u64;
            let mut entries = header.entries();
            while let Some(entry) = entries.next()? {
                let range = entry.range();
                if range.begin < range.end {
                    aranges.push((range.begin, range.end, unit));
                }
            }
        }
        if aranges.is_empty() {
            return Ok(None);
        }
        let Some(info) = section_named(&object, SectionId::DebugInfo) else {
            return Ok(None);
        };
        let info = InfoBytes::new(info.compressed_data()?, map, endian)?;
        Ok(Some(Prefix {
            endian,
            sections,
            aranges,
            info,
            abbrev,
            line,
            covered: 0,
            context: None,
        }))
    }

    /// The frames of `probe` from the prefix, or `None` when only the full loader can say.
    fn frames(&mut self, probe: u64, map: &Mmap) -> Option<Vec<DwarfFrame>> {
        // Every unit .debug_aranges names for the address must lie inside the prefix.
        let mut needed: Option<usize> = None;
        for &(begin, end, unit) in &self.aranges {
            if begin <= probe && probe < end {
                let unit_end = self.info.unit_end(usize::try_from(unit).ok()?, map)?;
                needed = Some(needed.map_or(unit_end, |n| n.max(unit_end)));
            }
        }
        let needed = needed?;
        if needed > self.covered || self.context.is_none() {
            self.extend(needed, map)?;
        }
        let context = self.context.as_ref()?;
        let iter = match context.find_frames(probe) {
            LookupResult::Output(Ok(iter)) => iter,
            // Split DWARF or an error (a reference beyond the prefix): the full loader decides.
            _ => return None,
        };
        collect_frames(iter).ok()
    }

    /// Inflates `.debug_info` to at least `needed` bytes and rebuilds the context on it. Each
    /// build parses every unit header of the prefix again, so the second build takes the whole
    /// section (as does a first one past its middle): at most one and a half times the parsing of
    /// the whole, usually a small part of it once.
    fn extend(&mut self, needed: usize, map: &Mmap) -> Option<()> {
        let target = if self.context.is_none() && needed <= self.info.total / 2 {
            needed
        } else {
            self.info.total
        };
        let info_total = self.info.total;
        let bytes = self.info.inflate_to(target, map)?;
        // The last unit boundary the bytes hold (units follow each other from offset 0).
        let mut boundary = self.covered;
        while let Some(end) = unit_end_in(bytes, boundary, self.endian) {
            if end > bytes.len() {
                break;
            }
            boundary = end;
        }
        if boundary < needed {
            return None;
        }
        let info_bytes = &bytes[..boundary];
        let info = Reader::new(Rc::from(info_bytes), self.endian);
        // The abbreviation tables and line programs of the prefix's units (when the prefix
        // is the whole section, or anything is amiss: the sections whole).
        let whole = boundary >= info_total;
        let (abbrev_needed, line_needed) = if whole {
            (usize::MAX, usize::MAX)
        } else {
            tables_needed(
                info_bytes,
                self.abbrev.as_mut(),
                self.line.as_mut(),
                map,
                self.endian,
            )
            .unwrap_or((usize::MAX, usize::MAX))
        };
        let empty = Reader::new(Rc::from(Vec::new()), self.endian);
        let lazy_reader = |section: &mut Option<InfoBytes>, needed: usize| -> Option<Reader> {
            Some(match section {
                Some(section) => {
                    Reader::new(Rc::from(section.inflate_to(needed, map)?), self.endian)
                }
                None => empty.clone(),
            })
        };
        let abbrev = lazy_reader(&mut self.abbrev, abbrev_needed)?;
        let line = lazy_reader(&mut self.line, line_needed)?;
        let sections = &self.sections;
        let mut dwarf = gimli::Dwarf::load(|id| -> Result<Reader, gimli::Error> {
            match id {
                SectionId::DebugInfo => return Ok(info.clone()),
                SectionId::DebugAbbrev => return Ok(abbrev.clone()),
                SectionId::DebugLine => return Ok(line.clone()),
                _ => {}
            }
            Ok(sections
                .iter()
                .find(|(have, _)| *have == id)
                .map_or_else(|| empty.clone(), |(_, data)| data.clone()))
        })
        .ok()?;
        dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        self.context = Some(Context::from_dwarf(dwarf).ok()?);
        self.covered = boundary;
        Some(())
    }
}

/// The sections `addr2line` reads to symbolise (not location lists, macros or `.debug_info`,
/// which is read by prefix).
const NEEDED: [SectionId; 9] = [
    SectionId::DebugAbbrev,
    SectionId::DebugAddr,
    SectionId::DebugAranges,
    SectionId::DebugLine,
    SectionId::DebugLineStr,
    SectionId::DebugStr,
    SectionId::DebugStrOffsets,
    SectionId::DebugRanges,
    SectionId::DebugRngLists,
];

/// The section for `id`, under its name or its GNU-compressed `.zdebug_` name.
fn section_named<'data, 'file>(
    object: &'file object::File<'data>,
    id: SectionId,
) -> Option<object::Section<'data, 'file>> {
    let name = id.name();
    object.section_by_name(name).or_else(|| {
        let zname = format!(".z{}", name.strip_prefix('.')?);
        object.section_by_name(&zname)
    })
}

/// How far `.debug_abbrev` and `.debug_line` must be inflated for the units of `info` (whole
/// units from offset 0): the end of the last abbreviation table and of the last line program
/// they name. `None` when the tables cannot be followed (the caller then inflates the sections
/// whole). A table read whole here reads the same in the whole section, and a line program
/// lies within its length field: what the prefix's units read is all there.
fn tables_needed(
    info: &[u8],
    mut abbrev: Option<&mut InfoBytes>,
    mut line: Option<&mut InfoBytes>,
    map: &Mmap,
    endian: RunTimeEndian,
) -> Option<(usize, usize)> {
    let (mut abbrev_needed, mut line_needed) = (0usize, 0usize);
    let mut units = gimli::DebugInfo::new(info, endian).units();
    while let Some(header) = units.next().ok()? {
        let Some(abbrev) = abbrev.as_deref_mut() else {
            // No abbreviations: the context cannot read the unit either way.
            return None;
        };
        let offset = header.debug_abbrev_offset().0;
        let table_end = abbrev.table_end(offset, map)?;
        abbrev_needed = abbrev_needed.max(table_end);
        let bytes = abbrev.inflate_to(table_end, map)?;
        let abbreviations = header
            .abbreviations(&gimli::DebugAbbrev::new(&bytes[..table_end], endian))
            .ok()?;
        let mut entries = header.entries(&abbreviations);
        let root = entries.next_dfs().ok()??;
        match root.attr_value(gimli::DW_AT_stmt_list) {
            Some(gimli::AttributeValue::DebugLineRef(program)) => {
                let line = line.as_deref_mut()?;
                let end = line.unit_end(program.0, map)?;
                line_needed = line_needed.max(end);
            }
            None => {}
            _ => return None,
        }
    }
    Some((abbrev_needed, line_needed))
}

/// End of the abbreviation table at `offset` in `bytes` (after its terminating 0 code):
/// `Ok(None)` when `bytes` ends first, `Err` when it is malformed.
fn abbrev_table_end(bytes: &[u8], offset: usize) -> Result<Option<usize>, ()> {
    let mut at = offset;
    // One ULEB128, or None at the end of the bytes.
    let uleb = |at: &mut usize| -> Result<Option<u64>, ()> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let Some(&byte) = bytes.get(*at) else {
                return Ok(None);
            };
            *at += 1;
            if shift < 64 {
                value |= u64::from(byte & 0x7f) << shift;
            }
            shift = shift.saturating_add(7);
            if byte & 0x80 == 0 {
                return Ok(Some(value));
            }
            if shift > 70 {
                return Err(());
            }
        }
    };
    loop {
        let Some(code) = uleb(&mut at)? else {
            return Ok(None);
        };
        if code == 0 {
            return Ok(Some(at));
        }
        // Tag, then the children byte.
        if uleb(&mut at)?.is_none() {
            return Ok(None);
        }
        if bytes.get(at).is_none() {
            return Ok(None);
        }
        at += 1;
        loop {
            let Some(name) = uleb(&mut at)? else {
                return Ok(None);
            };
            let Some(form) = uleb(&mut at)? else {
                return Ok(None);
            };
            if form == u64::from(gimli::DW_FORM_implicit_const.0) {
                // Its value: a SLEB128, the same bytes as a ULEB128's.
                if uleb(&mut at)?.is_none() {
                    return Ok(None);
                }
            }
            if name == 0 && form == 0 {
                break;
            }
        }
    }
}

/// End of the unit that starts at `offset` in `bytes`, if its length field is there.
fn unit_end_in(bytes: &[u8], offset: usize, endian: RunTimeEndian) -> Option<usize> {
    let word = |at: usize, size: usize| -> Option<u64> {
        let raw = bytes.get(at..at.checked_add(size)?)?;
        let mut value = 0u64;
        for (i, &b) in raw.iter().enumerate() {
            let shift = match endian {
                RunTimeEndian::Little => 8 * i,
                RunTimeEndian::Big => 8 * (size - 1 - i),
            };
            value |= u64::from(b) << shift;
        }
        Some(value)
    };
    let length = word(offset, 4)?;
    let (header, length) = if length == 0xffff_ffff {
        (12, word(offset + 4, 8)?)
    } else {
        (4, length)
    };
    offset
        .checked_add(header)?
        .checked_add(usize::try_from(length).ok()?)
}

/// `.debug_info`, inflated on demand.
struct InfoBytes {
    endian: RunTimeEndian,
    source: InfoSource,
    /// What has been inflated so far (all of it for the other sources).
    out: Vec<u8>,
    total: usize,
}

enum InfoSource {
    /// Stored plainly: the range of the file.
    Plain { start: usize },
    /// zlib: the compressed range of the file and the inflater's state.
    Zlib {
        start: usize,
        len: usize,
        inflater: Box<flate2::Decompress>,
    },
    /// Inflated whole already (other compressions).
    Whole,
}

impl InfoBytes {
    fn new(
        data: object::CompressedData<'_>,
        map: &Mmap,
        endian: RunTimeEndian,
    ) -> Result<InfoBytes, BoxError> {
        let total = usize::try_from(data.uncompressed_size)?;
        let start = (data.data.as_ptr() as usize).wrapping_sub(map.as_ptr() as usize);
        let in_map = start
            .checked_add(data.data.len())
            .is_some_and(|end| end <= map.len());
        Ok(match data.format {
            CompressionFormat::None if in_map => InfoBytes {
                endian,
                source: InfoSource::Plain { start },
                out: Vec::new(),
                total: data.data.len(),
            },
            CompressionFormat::Zlib if in_map => InfoBytes {
                endian,
                source: InfoSource::Zlib {
                    start,
                    len: data.data.len(),
                    inflater: Box::new(flate2::Decompress::new(true)),
                },
                out: Vec::new(),
                total,
            },
            _ => {
                let out = data.decompress()?.into_owned();
                InfoBytes {
                    endian,
                    source: InfoSource::Whole,
                    total: out.len(),
                    out,
                }
            }
        })
    }

    /// End of the unit starting at `offset`, inflating as far as its length field.
    fn unit_end(&mut self, offset: usize, map: &Mmap) -> Option<usize> {
        let (endian, total) = (self.endian, self.total);
        let bytes = self.inflate_to(offset.checked_add(12)?.min(self.total), map)?;
        unit_end_in(bytes, offset, endian).filter(|&end| end <= total)
    }

    /// End of the abbreviation table at `offset`, inflating as far as it goes.
    fn table_end(&mut self, offset: usize, map: &Mmap) -> Option<usize> {
        let mut target = offset.checked_add(1 << 12)?;
        loop {
            let total = self.total;
            let bytes = self.inflate_to(target, map)?;
            match abbrev_table_end(bytes, offset) {
                Ok(Some(end)) => return Some(end),
                Ok(None) if bytes.len() < total => target = bytes.len().checked_mul(2)?,
                _ => return None,
            }
        }
    }

    /// The first `min(target, total)` bytes at least (more when already inflated).
    fn inflate_to(&mut self, target: usize, map: &Mmap) -> Option<&[u8]> {
        let target = target.min(self.total);
        match &mut self.source {
            InfoSource::Plain { start } => {
                if self.out.len() < target {
                    let bytes = map.get(*start..start.checked_add(target)?)?;
                    self.out = bytes.to_vec();
                }
            }
            InfoSource::Zlib {
                start,
                len,
                inflater,
            } => {
                let compressed = map.get(*start..start.checked_add(*len)?)?;
                while self.out.len() < target {
                    // Inflate in steps of at least 64 KiB so that small targets stay cheap.
                    let step = (target - self.out.len()).max(64 << 10);
                    self.out
                        .reserve(step.min(self.total.saturating_sub(self.out.len())).max(1));
                    let consumed = usize::try_from(inflater.total_in()).ok()?;
                    let before = self.out.len();
                    let status = inflater
                        .decompress_vec(
                            compressed.get(consumed..)?,
                            &mut self.out,
                            flate2::FlushDecompress::None,
                        )
                        .ok()?;
                    if status == flate2::Status::StreamEnd {
                        break;
                    }
                    if self.out.len() == before {
                        return None;
                    }
                }
            }
            InfoSource::Whole => {}
        }
        (self.out.len() >= target).then_some(&self.out[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{ObjectSymbol, SymbolKind};

    /// Says a part of a test did not run, loudly: on stderr and in the suite's list of skips
    /// (`VRAMSHIM_SKIPPED_FILE`, which `scripts/test.sh` prints in its final summary).
    fn skipped(what: &str) {
        use std::io::Write;
        let line = format!("SKIPPED: {what}");
        eprintln!("{line}");
        if let Some(path) = std::env::var_os("VRAMSHIM_SKIPPED_FILE")
            && let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }

    /// libc's separate debug file (GNU build id), when the machine has one installed.
    fn libc_debug_file() -> Option<PathBuf> {
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .find(|path| Path::new(path).exists())?;
        let bytes = std::fs::read(libc).ok()?;
        let object = object::File::parse(&*bytes).ok()?;
        let id = object.build_id().ok()??;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let path = PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
        path.exists().then_some(path)
    }

    /// (function, file, line) of each frame.
    fn described(frames: &[DwarfFrame]) -> Vec<(Option<String>, Option<String>, Option<u32>)> {
        frames
            .iter()
            .map(|f| (f.function.clone(), f.file.clone(), f.line))
            .collect()
    }

    /// Addresses across `path`'s code: inside every `step`-th function of its symbol table.
    fn probes(path: &Path, step: usize) -> Vec<u64> {
        let bytes = std::fs::read(path).expect("read the object");
        let object = object::File::parse(&*bytes).expect("parse the object");
        let mut functions: Vec<(u64, u64)> = object
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
            .map(|s| (s.address(), s.size()))
            .collect();
        functions.sort();
        functions.dedup();
        functions
            .iter()
            .step_by(step.max(1))
            .map(|&(address, size)| address + size / 2)
            .collect()
    }

    // Each address asked of a fresh loader (the prefix as small as that address allows, its
    // abbreviation tables and line programs inflated only as far as its units read), then all
    // of them of one loader in turn (the prefix growing to the whole): every answer is the full
    // `addr2line` loader's.
    #[test]
    fn the_prefix_answers_as_the_full_loader_does() {
        let mut files = vec![(std::env::current_exe().expect("test binary"), 2000, 2)];
        match libc_debug_file() {
            Some(libc) => files.push((libc, 80, usize::MAX)),
            None => skipped(
                "debug_prefix: libc's separate debug file is not installed (libc6-dbg): only \
                 the test binary's half of the_prefix_answers_as_the_full_loader_does ran",
            ),
        }
        for (path, step, fresh_at_most) in files {
            let full = Loader::new(&path).expect("full loader");
            let probes = probes(&path, step);
            assert!(
                probes.len() > 10,
                "{}: {} probes",
                path.display(),
                probes.len()
            );
            let open =
                || ObjectLoader::open(File::open(&path).expect("open"), &path).expect("loader");
            let expected: Vec<_> = probes
                .iter()
                .map(|&probe| {
                    described(
                        &collect_frames(full.find_frames(probe).expect("full frames"))
                            .expect("full frames"),
                    )
                })
                .collect();
            assert!(
                expected.iter().filter(|e| !e.is_empty()).count() > probes.len() / 2,
                "{}: most probes have frames",
                path.display()
            );
            let (mut fresh, mut by_prefix) = (0, 0);
            for (probe, expected) in probes.iter().zip(&expected).take(fresh_at_most) {
                let loader = open();
                let found = loader.frames(*probe).expect("frames");
                assert_eq!(
                    &described(&found),
                    expected,
                    "{} at {probe:#x}",
                    path.display()
                );
                fresh += 1;
                if loader.full.get().is_none() {
                    by_prefix += 1;
                }
            }
            // libc's debug file has `.debug_aranges`: its answers come from the prefix.
            if fresh_at_most == usize::MAX {
                assert!(
                    by_prefix * 10 >= fresh * 9,
                    "{by_prefix} of {fresh} by the prefix"
                );
            }
            let loader = open();
            for (probe, expected) in probes.iter().zip(&expected) {
                let found = loader.frames(*probe).expect("frames");
                assert_eq!(
                    &described(&found),
                    expected,
                    "{} at {probe:#x}",
                    path.display()
                );
            }
        }
    }
}
