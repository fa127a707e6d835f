//! Legacy binary Office files (.doc, .ppt, .xls) are Compound File Binary (OLE2) containers:
//! a small file system of named streams. This opens one with the `cfb` crate and reads a
//! stream, bounded by the file itself.
//!
//! `cfb` checks the allocation tables when it opens a file (no sector in two chains, no chain
//! back to its start, no loop in the directory tree), so every stream is a finite chain of the
//! file's own sectors: no stream read here is longer than the file, which `max_input_bytes`
//! bounds. Reads are capped at the file's size all the same, whatever a directory entry
//! declares.

use std::io::{Cursor, Read};

use crate::ExtractError;

/// An opened container.
pub(crate) struct Container<'a> {
    format: &'static str,
    file: cfb::CompoundFile<Cursor<&'a [u8]>>,
    size: u64,
}

/// A buffer declared bigger than this grows as it is filled instead.
const MAX_PREALLOCATION: u64 = 16 * 1024 * 1024;

impl<'a> Container<'a> {
    /// Opens `bytes` as a compound file; anything else is a corrupt `format` file.
    pub(crate) fn open(format: &'static str, bytes: &'a [u8]) -> Result<Self, ExtractError> {
        let file = cfb::CompoundFile::open(Cursor::new(bytes)).map_err(|e| {
            ExtractError::corrupt(format, format!("not a valid OLE2 compound file ({e})"))
        })?;
        Ok(Self {
            format,
            file,
            size: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
        })
    }

    /// The stream `name` of the root storage, or `None` when there is none.
    pub(crate) fn stream(&mut self, name: &str) -> Result<Option<Vec<u8>>, ExtractError> {
        let path = format!("/{name}");
        if !self.file.is_stream(&path) {
            return Ok(None);
        }
        let format = self.format;
        let broken = |e: std::io::Error| ExtractError::corrupt(format, format!("{name}: {e}"));
        let mut stream = self.file.open_stream(&path).map_err(broken)?;
        let declared = stream.len().min(self.size).min(MAX_PREALLOCATION);
        let mut data = Vec::with_capacity(usize::try_from(declared).unwrap_or(0));
        (&mut stream)
            .take(self.size)
            .read_to_end(&mut data)
            .map_err(broken)?;
        Ok(Some(data))
    }

    /// Like [`Self::stream`], but a missing stream is an error naming what the file lacks.
    pub(crate) fn required(&mut self, name: &str) -> Result<Vec<u8>, ExtractError> {
        self.stream(name)?
            .ok_or_else(|| ExtractError::corrupt(self.format, format!("it has no {name} stream")))
    }
}

/// Little-endian integers at `at`, `None` past the end.
pub(crate) fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    let bytes = data.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([bytes[0], bytes[1]]))
}

pub(crate) fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// A `u32` as a `usize` (saturating on a 16-bit target, which this never runs on).
pub(crate) fn index(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}
