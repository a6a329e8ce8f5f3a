//! The events as an Apache Parquet file (one row per event), written by hand: required
//! columns only (no definition or repetition levels), PLAIN encoding, GZIP-compressed pages
//! (flate2, fast level: a tenth of the plain size or less on real logs), one data page per
//! column and row group. File metadata and page headers are Thrift compact protocol,
//! of which only the few types used are written here.
//!
//! Columns: `t_ns` (ns since the earliest process started), `pid`, `thread`, `event`, `api`,
//! `device`, `addr`, `size`, `stream`, `handle`, `result`, `stack` (the stack id, per
//! process; 0 = none). A free records no size: its row has the size of what it freed.

use std::io::{self, Write};

use flate2::Compression;
use flate2::write::GzEncoder;

use vramshim_format::Event;

use crate::analysis::events::EventSink;
use crate::replay::Process;

/// Rows per row group: bounds the memory held before a group is written (about 100 bytes a
/// row).
const ROW_GROUP_ROWS: usize = 1 << 18;

/// Parquet physical types (`Type` in parquet.thrift).
#[derive(Clone, Copy)]
enum Physical {
    Int32 = 1,
    Int64 = 2,
    ByteArray = 6,
}

/// Parquet converted types (`ConvertedType`) used here.
#[derive(Clone, Copy)]
enum Converted {
    Utf8 = 0,
    Uint64 = 14,
}

/// A column and its values of the current row group, PLAIN-encoded.
struct Column {
    name: &'static str,
    physical: Physical,
    converted: Option<Converted>,
    data: Vec<u8>,
}

impl Column {
    fn new(name: &'static str, physical: Physical, converted: Option<Converted>) -> Column {
        Column {
            name,
            physical,
            converted,
            data: Vec::new(),
        }
    }

    fn i32(&mut self, value: i32) {
        self.data.extend_from_slice(&value.to_le_bytes());
    }

    fn i64(&mut self, value: i64) {
        self.data.extend_from_slice(&value.to_le_bytes());
    }

    fn u64(&mut self, value: u64) {
        self.data.extend_from_slice(&value.to_le_bytes());
    }

    fn text(&mut self, value: &str) {
        self.data
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.data.extend_from_slice(value.as_bytes());
    }
}

/// Where a written column chunk lies, for the footer.
struct ChunkInfo {
    offset: u64,
    /// Bytes in the file (page header and compressed page).
    size: u64,
    /// Bytes before compression (page header and plain page).
    plain_size: u64,
}

struct RowGroupInfo {
    rows: u64,
    chunks: Vec<ChunkInfo>,
}

/// Streams events into `out` as Parquet: [`EventSink`] rows as they come, then
/// [`Self::finish`].
pub struct ParquetWriter<W: Write> {
    out: W,
    /// Bytes written so far: offsets in the footer are from the file's start.
    written: u64,
    columns: Vec<Column>,
    rows: usize,
    total_rows: u64,
    groups: Vec<RowGroupInfo>,
    /// The first write error; nothing more is written after it.
    pub error: Option<io::Error>,
}

const MAGIC: &[u8; 4] = b"PAR1";

impl<W: Write> ParquetWriter<W> {
    pub fn new(out: W) -> ParquetWriter<W> {
        use Converted::*;
        use Physical::*;
        let columns = vec![
            Column::new("t_ns", Int64, None),
            Column::new("pid", Int32, None),
            Column::new("thread", Int32, None),
            Column::new("event", ByteArray, Some(Utf8)),
            Column::new("api", ByteArray, Some(Utf8)),
            Column::new("device", Int32, None),
            Column::new("addr", Int64, Some(Uint64)),
            Column::new("size", Int64, Some(Uint64)),
            Column::new("stream", Int64, Some(Uint64)),
            Column::new("handle", Int64, Some(Uint64)),
            Column::new("result", Int64, None),
            Column::new("stack", Int64, None),
        ];
        let mut writer = ParquetWriter {
            out,
            written: 0,
            columns,
            rows: 0,
            total_rows: 0,
            groups: Vec::new(),
            error: None,
        };
        if let Err(err) = writer.write(MAGIC) {
            writer.error = Some(err);
        }
        writer
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Writes the buffered rows as one row group.
    fn flush_group(&mut self) -> io::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let rows = self.rows;
        let mut chunks = Vec::with_capacity(self.columns.len());
        for index in 0..self.columns.len() {
            let plain = std::mem::take(&mut self.columns[index].data);
            let mut gz = GzEncoder::new(Vec::with_capacity(plain.len() / 4), Compression::fast());
            gz.write_all(&plain)?;
            let compressed = gz.finish()?;
            let header = page_header(rows, plain.len(), compressed.len())?;
            let offset = self.written;
            self.write(&header)?;
            self.write(&compressed)?;
            chunks.push(ChunkInfo {
                offset,
                size: self.written - offset,
                plain_size: (header.len() + plain.len()) as u64,
            });
        }
        self.groups.push(RowGroupInfo {
            rows: rows as u64,
            chunks,
        });
        self.total_rows += rows as u64;
        self.rows = 0;
        Ok(())
    }

    /// Writes what is buffered and the footer; returns the number of rows.
    pub fn finish(mut self) -> io::Result<u64> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        self.flush_group()?;
        let footer = self.footer();
        self.write(&footer)?;
        let length = u32::try_from(footer.len())
            .map_err(|_| io::Error::other("Parquet footer too large"))?;
        self.write(&length.to_le_bytes())?;
        self.write(MAGIC)?;
        self.out.flush()?;
        Ok(self.total_rows)
    }

    /// FileMetaData.
    fn footer(&self) -> Vec<u8> {
        let mut t = Compact::default();
        t.field_i32(1, 1); // version
        t.field_list(2, STRUCT, self.columns.len() + 1); // schema
        t.begin_struct();
        t.field_binary(4, b"schema");
        t.field_i32(5, self.columns.len() as i32); // num_children
        t.end_struct();
        for column in &self.columns {
            t.begin_struct();
            t.field_i32(1, column.physical as i32); // type
            t.field_i32(3, 0); // repetition_type: REQUIRED
            t.field_binary(4, column.name.as_bytes());
            if let Some(converted) = column.converted {
                t.field_i32(6, converted as i32);
            }
            t.end_struct();
        }
        t.field_i64(3, self.total_rows as i64); // num_rows
        t.field_list(4, STRUCT, self.groups.len()); // row_groups
        for group in &self.groups {
            t.begin_struct();
            t.field_list(1, STRUCT, group.chunks.len()); // columns
            for (column, chunk) in self.columns.iter().zip(&group.chunks) {
                t.begin_struct();
                t.field_i64(2, chunk.offset as i64); // file_offset
                t.field_struct(3); // meta_data: ColumnMetaData
                t.field_i32(1, column.physical as i32); // type
                t.field_list(2, I32, 1); // encodings
                t.list_i32(0); // PLAIN
                t.field_list(3, BINARY, 1); // path_in_schema
                t.list_binary(column.name.as_bytes());
                t.field_i32(4, 2); // codec: GZIP
                t.field_i64(5, group.rows as i64); // num_values
                t.field_i64(6, chunk.plain_size as i64); // total_uncompressed_size
                t.field_i64(7, chunk.size as i64); // total_compressed_size
                t.field_i64(9, chunk.offset as i64); // data_page_offset
                t.end_struct();
                t.end_struct();
            }
            let size: u64 = group.chunks.iter().map(|c| c.size).sum();
            t.field_i64(2, size as i64); // total_byte_size
            t.field_i64(3, group.rows as i64); // num_rows
            t.end_struct();
        }
        t.field_binary(
            6,
            format!("vramshim {}", env!("CARGO_PKG_VERSION")).as_bytes(),
        ); // created_by
        t.end_struct();
        t.bytes
    }
}

/// PageHeader of a v1 data page of `rows` PLAIN values, `plain` bytes, `compressed` once
/// compressed.
fn page_header(rows: usize, plain: usize, compressed: usize) -> io::Result<Vec<u8>> {
    let too_large = |_| io::Error::other("Parquet page too large");
    let plain = i32::try_from(plain).map_err(too_large)?;
    let compressed = i32::try_from(compressed).map_err(too_large)?;
    let mut t = Compact::default();
    t.field_i32(1, 0); // type: DATA_PAGE
    t.field_i32(2, plain); // uncompressed_page_size
    t.field_i32(3, compressed); // compressed_page_size
    t.field_struct(5); // data_page_header
    t.field_i32(1, rows as i32); // num_values
    t.field_i32(2, 0); // encoding: PLAIN
    t.field_i32(3, 3); // definition_level_encoding: RLE
    t.field_i32(4, 3); // repetition_level_encoding: RLE
    t.end_struct();
    t.end_struct();
    Ok(t.bytes)
}

impl<W: Write> EventSink for ParquetWriter<W> {
    fn event(&mut self, process: u32, t_ns: u64, event: &Event, processes: &[Process]) {
        if self.error.is_some() {
            return;
        }
        let header = processes.get(process as usize).map(|p| &p.header);
        let api = header.map_or_else(
            || format!("api#{}", event.api).into(),
            |h| h.api_name(event.api),
        );
        let [
            t,
            pid,
            thread,
            kind,
            api_column,
            device,
            addr,
            size,
            stream,
            handle,
            result,
            stack,
        ] = &mut self.columns[..]
        else {
            return;
        };
        t.i64(t_ns as i64);
        pid.i32(header.map_or(0, |h| h.pid) as i32);
        thread.i32(event.thread as i32);
        kind.text(event.kind.name());
        api_column.text(&api);
        device.i32(event.device);
        addr.u64(event.addr);
        size.u64(event.size);
        stream.u64(event.stream);
        handle.u64(event.handle);
        result.i64(i64::from(event.result));
        stack.i64(i64::from(event.stack));
        self.rows += 1;
        if self.rows >= ROW_GROUP_ROWS
            && let Err(err) = self.flush_group()
        {
            self.error = Some(err);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Thrift compact protocol, writing only.

const I32: u8 = 5;
const I64: u8 = 6;
const BINARY: u8 = 8;
const STRUCT: u8 = 12;

#[derive(Default)]
struct Compact {
    bytes: Vec<u8>,
    /// The last field id of each open struct (the outermost is implicit).
    last: Vec<i16>,
    current: i16,
}

impl Compact {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push((value as u8) | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }

    fn zigzag(&mut self, value: i64) {
        self.varint(((value << 1) ^ (value >> 63)) as u64);
    }

    fn field(&mut self, id: i16, kind: u8) {
        let delta = id - self.current;
        if (1..=15).contains(&delta) {
            self.bytes.push((delta as u8) << 4 | kind);
        } else {
            self.bytes.push(kind);
            self.zigzag(i64::from(id));
        }
        self.current = id;
    }

    fn field_i32(&mut self, id: i16, value: i32) {
        self.field(id, I32);
        self.zigzag(i64::from(value));
    }

    fn field_i64(&mut self, id: i16, value: i64) {
        self.field(id, I64);
        self.zigzag(value);
    }

    fn field_binary(&mut self, id: i16, value: &[u8]) {
        self.field(id, BINARY);
        self.list_binary(value);
    }

    /// A struct-valued field; its fields follow, then [`Self::end_struct`].
    fn field_struct(&mut self, id: i16) {
        self.field(id, STRUCT);
        self.begin_struct();
    }

    /// A list field of `len` elements of `kind`; the elements follow.
    fn field_list(&mut self, id: i16, kind: u8, len: usize) {
        self.field(id, 9);
        if len < 15 {
            self.bytes.push((len as u8) << 4 | kind);
        } else {
            self.bytes.push(0xf0 | kind);
            self.varint(len as u64);
        }
    }

    fn list_i32(&mut self, value: i32) {
        self.zigzag(i64::from(value));
    }

    fn list_binary(&mut self, value: &[u8]) {
        self.varint(value.len() as u64);
        self.bytes.extend_from_slice(value);
    }

    /// A struct (a list element, or after [`Self::field_struct`]).
    fn begin_struct(&mut self) {
        self.last.push(self.current);
        self.current = 0;
    }

    fn end_struct(&mut self) {
        self.bytes.push(0);
        self.current = self.last.pop().unwrap_or(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_fields_use_deltas_and_zigzag() {
        let mut t = Compact::default();
        t.field_i32(1, 1);
        t.field_i32(3, -1);
        t.field_i64(20, 300);
        t.end_struct();
        assert_eq!(
            t.bytes,
            [0x15, 0x02, 0x25, 0x01, 0x06, 0x28, 0xd8, 0x04, 0x00]
        );
    }

    #[test]
    fn compact_lists_have_short_and_long_headers() {
        let mut t = Compact::default();
        t.field_list(2, I32, 2);
        t.list_i32(0);
        t.list_i32(1);
        t.field_list(3, STRUCT, 20);
        assert_eq!(t.bytes, [0x29, 0x25, 0x00, 0x02, 0x19, 0xfc, 0x14]);
    }
}
