//! Hostile inputs, made small: the decompression bombs and maximum-size files that the
//! extraction bounds are tested and measured against (this crate's tests and the
//! `extract-peak` benchmark). Never used by the extraction itself.

use std::io::Write as _;

use flate2::Compression;
use flate2::write::ZlibEncoder;

/// One crafted file: what it is called, what it claims to be, and its bytes.
#[derive(Debug, Clone)]
pub struct Bomb {
    /// Short name (the benchmark's argument).
    pub name: &'static str,
    /// What it does to a naive reader.
    pub what: &'static str,
    /// The MIME type it is uploaded as.
    pub mime_type: &'static str,
    /// The file name it is uploaded as.
    pub file_name: &'static str,
    /// The file.
    pub bytes: Vec<u8>,
}

const MIB: usize = 1024 * 1024;

/// Names of every bomb [`by_name`] makes, in the benchmark's order.
pub const NAMES: &[&str] = &[
    "bmp-rle8-9000",
    "png-100000",
    "docx-inflate-1g",
    "docx-lying-sizes",
    "xlsx-empty-strings",
    "xls-dimensions",
    "xls-corners",
    "pdf-flate-500m",
    "pdf-flate-tokens",
    "pdf-objstm",
    "pdf-array-100m",
    "text-100m",
    "pdf-images-100m",
];

/// The bomb called `name` (one of [`NAMES`]) at its full size, or `None`.
pub fn by_name(name: &str) -> Option<Bomb> {
    let (what, mime_type, file_name, bytes): (&'static str, &'static str, &'static str, _) =
        match name {
            "bmp-rle8-9000" => (
                "1 KiB RLE8 BMP declaring 9000x9000 (243 MB of RGB when decoded)",
                "image/bmp",
                "bomb.bmp",
                bmp_rle8(9000, 9000),
            ),
            "png-100000" => (
                "PNG declaring 100000x100000 RGBA (40 GB when decoded)",
                "image/png",
                "bomb.png",
                png_declaring(100_000, 100_000),
            ),
            "docx-inflate-1g" => (
                "DOCX whose document.xml inflates to 1 GiB",
                crate::DOCX,
                "bomb.docx",
                docx_inflating_to(1024 * MIB),
            ),
            "docx-lying-sizes" => (
                "DOCX whose zip entry declares 1 KiB and inflates to 256 MiB",
                crate::DOCX,
                "liar.docx",
                docx_lying_about_size(256 * MIB),
            ),
            "xlsx-empty-strings" => (
                "XLSX whose 49 MiB shared-string table is 10 million empty strings",
                crate::XLSX,
                "strings.xlsx",
                xlsx_empty_shared_strings(49 * MIB),
            ),
            "xls-dimensions" => (
                "XLS whose DIMENSIONS record declares 4 billion rows by 256 columns",
                "application/vnd.ms-excel",
                "dimensions.xls",
                xls_declaring_dimensions(),
            ),
            "xls-corners" => (
                "XLS of 4 sheets each with a cell at A1 and at IV65536 (67 million cells if dense)",
                "application/vnd.ms-excel",
                "corners.xls",
                xls_far_corners(4),
            ),
            "pdf-flate-500m" => (
                "PDF whose page content inflates to 500 MiB",
                "application/pdf",
                "flate.pdf",
                pdf_flate_page(500 * MIB),
            ),
            "pdf-flate-tokens" => (
                "PDF whose page content inflates to 48 MiB of operands (under the cap)",
                "application/pdf",
                "tokens.pdf",
                pdf_flate_page(48 * MIB),
            ),
            "pdf-objstm" => (
                "PDF with 8 object streams each inflating to 48 MiB of array items",
                "application/pdf",
                "objstm.pdf",
                pdf_object_streams(8, 48 * MIB),
            ),
            "pdf-array-100m" => (
                "uncompressed 100 MB PDF holding one array of 50 million integers",
                "application/pdf",
                "array.pdf",
                pdf_array(100 * 1000 * 1000),
            ),
            "text-100m" => (
                "100 MiB UTF-8 text file (the upload limit)",
                "text/plain",
                "big.txt",
                text(100 * MIB),
            ),
            "pdf-images-100m" => (
                "legitimate 100 MB PDF: 95 pages, each a 1 MB image and a line of text",
                "application/pdf",
                "scans.pdf",
                pdf_with_images(95, 1000 * 1000),
            ),
            _ => return None,
        };
    let name = NAMES.iter().find(|n| **n == name).copied()?;
    Some(Bomb {
        name,
        what,
        mime_type,
        file_name,
        bytes,
    })
}

/// A BMP of `width` x `height` 8-bit palette pixels, RLE8-compressed to nothing (the
/// data is only the end-of-bitmap marker): about 1 KiB whatever it declares.
pub fn bmp_rle8(width: u32, height: u32) -> Vec<u8> {
    let palette: Vec<u8> = (0..=255u8).flat_map(|i| [i, i, i, 0]).collect();
    let data = [0u8, 1]; // RLE8 end of bitmap.
    let offset = 14 + 40 + palette.len();
    let size = offset + data.len();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(b"BM");
    out.extend_from_slice(&u32_of(size).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&u32_of(offset).to_le_bytes());
    out.extend_from_slice(&40u32.to_le_bytes());
    out.extend_from_slice(&width.to_le_bytes());
    out.extend_from_slice(&height.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // planes
    out.extend_from_slice(&8u16.to_le_bytes()); // bits per pixel
    out.extend_from_slice(&1u32.to_le_bytes()); // BI_RLE8
    out.extend_from_slice(&u32_of(data.len()).to_le_bytes());
    out.extend_from_slice(&2835u32.to_le_bytes());
    out.extend_from_slice(&2835u32.to_le_bytes());
    out.extend_from_slice(&256u32.to_le_bytes()); // colours used
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&palette);
    out.extend_from_slice(&data);
    out
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&u32_of(data.len()).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
}

/// A valid-looking PNG declaring `width` x `height` RGBA pixels, with one short row of
/// image data: a few dozen bytes.
pub fn png_declaring(width: u32, height: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    png_chunk(&mut out, b"IHDR", &ihdr);
    png_chunk(&mut out, b"IDAT", &zlib(&[0u8; 64], 64));
    png_chunk(&mut out, b"IEND", &[]);
    out
}

/// `total` bytes of `unit` repeated (the last copy cut), zlib-compressed as tightly as
/// flate2 can, without ever holding the inflated bytes.
fn zlib(unit: &[u8], total: usize) -> Vec<u8> {
    let mut encoder = ZlibEncoder::new(Vec::new(), Compression::best());
    let block: Vec<u8> = unit
        .iter()
        .copied()
        .cycle()
        .take(unit.len() * (64 * 1024 / unit.len().max(1)).max(1))
        .collect();
    let mut left = total;
    while left > 0 {
        let n = left.min(block.len());
        // Writing to a Vec cannot fail.
        let _ = encoder.write_all(&block[..n]);
        left -= n;
    }
    encoder.finish().unwrap_or_default()
}

/// One zip entry: `unit` repeated to `total` bytes, between `prefix` and `suffix`.
struct Entry<'a> {
    name: &'a str,
    prefix: &'a [u8],
    unit: &'a [u8],
    total: usize,
    suffix: &'a [u8],
}

/// A zip archive of `entries`, each deflated as it is generated (never held inflated).
fn zip_streamed(entries: &[Entry<'_>]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .compression_level(Some(9))
        .large_file(true);
    for entry in entries {
        if out.start_file(entry.name, options).is_err() {
            continue;
        }
        let _ = out.write_all(entry.prefix);
        let unit = entry.unit;
        let block: Vec<u8> = unit
            .iter()
            .copied()
            .cycle()
            .take(unit.len() * (64 * 1024 / unit.len().max(1)).max(1))
            .collect();
        let mut left = entry.total;
        while left > 0 {
            let n = left.min(block.len());
            let _ = out.write_all(&block[..n]);
            left -= n;
        }
        let _ = out.write_all(entry.suffix);
    }
    out.finish().map(|c| c.into_inner()).unwrap_or_default()
}

const DOC_HEAD: &[u8] = br#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>"#;
const DOC_TAIL: &[u8] = b"</w:body></w:document>";

fn paragraph_unit() -> Vec<u8> {
    let mut unit = b"<w:p><w:r><w:t>".to_vec();
    unit.extend(std::iter::repeat_n(b'a', 1000));
    unit.extend_from_slice(b"</w:t></w:r></w:p>");
    unit
}

/// A DOCX whose `word/document.xml` inflates to about `inflated` bytes of paragraphs.
pub fn docx_inflating_to(inflated: usize) -> Vec<u8> {
    zip_streamed(&[
        Entry {
            name: "[Content_Types].xml",
            prefix: b"",
            unit: b"<Types/>",
            total: 8,
            suffix: b"",
        },
        Entry {
            name: "word/document.xml",
            prefix: DOC_HEAD,
            unit: &paragraph_unit(),
            total: inflated,
            suffix: DOC_TAIL,
        },
    ])
}

/// Like [`docx_inflating_to`], but the zip headers claim the document is 1 KiB: a reader
/// that trusts declared sizes is fooled.
pub fn docx_lying_about_size(inflated: usize) -> Vec<u8> {
    let mut zip = docx_inflating_to(inflated);
    let lie = 1024u32.to_le_bytes();
    // Every local header (uncompressed size at +22) and central directory entry (+24) of
    // the document; ZIP64 extra fields are left alone (a reader picks either).
    let name = b"word/document.xml";
    let mut at = 0;
    while let Some(found) = find(&zip[at..], b"PK") {
        let i = at + found;
        let (size_at, name_at) = match zip.get(i..i + 4) {
            Some(b"PK\x03\x04") => (i + 22, i + 30),
            Some(b"PK\x01\x02") => (i + 24, i + 46),
            _ => (0, 0),
        };
        if name_at != 0 && zip.get(name_at..name_at + name.len()) == Some(&name[..]) {
            let declared = zip
                .get(size_at..size_at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            // 0xFFFFFFFF means "see ZIP64"; leave those.
            if declared != Some(u32::MAX) {
                zip[size_at..size_at + 4].copy_from_slice(&lie);
            }
        }
        at = i + 2;
    }
    zip
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An XLSX whose `xl/sharedStrings.xml` is about `inflated` bytes of `<si/>`: one empty
/// string per 5 bytes.
pub fn xlsx_empty_shared_strings(inflated: usize) -> Vec<u8> {
    let sheet = br#"<worksheet><sheetData><row r="1"><c r="A1" t="s"><v>0</v></c></row></sheetData></worksheet>"#;
    zip_streamed(&[
        Entry {
            name: "xl/sharedStrings.xml",
            prefix: b"<sst>",
            unit: b"<si/>",
            total: inflated,
            suffix: b"</sst>",
        },
        Entry {
            name: "xl/worksheets/sheet1.xml",
            prefix: b"",
            unit: sheet,
            total: sheet.len(),
            suffix: b"",
        },
    ])
}

/// A PDF whose object `i + 1` is `objects[i]` (object 1 the catalog), with a correct
/// cross-reference table.
fn pdf(objects: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"%PDF-1.5\n".to_vec();
    let mut offsets = Vec::with_capacity(objects.len());
    for (i, object) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        out.extend_from_slice(object);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

fn stream(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut out = format!("<< {dict} /Length {} >>\nstream\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\nendstream");
    out
}

fn page_tree(pages: usize, first_page: usize) -> Vec<Vec<u8>> {
    let kids: Vec<String> = (0..pages)
        .map(|i| format!("{} 0 R", first_page + i))
        .collect();
    vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} /MediaBox [0 0 612 792] >>",
            kids.join(" ")
        )
        .into_bytes(),
    ]
}

/// A one-page PDF whose content stream inflates to `inflated` bytes of `0 ` operands.
pub fn pdf_flate_page(inflated: usize) -> Vec<u8> {
    let mut objects = page_tree(1, 3);
    objects.push(b"<< /Type /Page /Parent 2 0 R /Resources << >> /Contents 4 0 R >>".to_vec());
    objects.push(stream("/Filter /FlateDecode", &zlib(b"0 ", inflated)));
    pdf(&objects)
}

/// A one-page PDF with `count` object streams, each inflating to `inflated` bytes: one
/// array of `0` integers (lopdf expands object streams while loading).
pub fn pdf_object_streams(count: usize, inflated: usize) -> Vec<u8> {
    let mut objects = page_tree(1, 3);
    objects.push(b"<< /Type /Page /Parent 2 0 R /Resources << >> /Contents 4 0 R >>".to_vec());
    objects.push(stream("", b"BT ET"));
    for i in 0..count {
        let header = format!("{} 0 ", 100_000 + i);
        let mut encoder = ZlibEncoder::new(Vec::new(), Compression::best());
        let _ = encoder.write_all(header.as_bytes());
        let _ = encoder.write_all(b"[");
        let body = zlib_into(encoder, b"0 ", inflated);
        objects.push(stream(
            &format!(
                "/Type /ObjStm /N 1 /First {} /Filter /FlateDecode",
                header.len()
            ),
            &body,
        ));
    }
    pdf(&objects)
}

fn zlib_into(mut encoder: ZlibEncoder<Vec<u8>>, unit: &[u8], total: usize) -> Vec<u8> {
    let block: Vec<u8> = unit.iter().copied().cycle().take(64 * 1024).collect();
    let mut left = total;
    while left > 0 {
        let n = left.min(block.len());
        let _ = encoder.write_all(&block[..n]);
        left -= n;
    }
    let _ = encoder.write_all(b"]");
    encoder.finish().unwrap_or_default()
}

/// An uncompressed PDF of about `size` bytes, nearly all of it one array of `0`s.
pub fn pdf_array(size: usize) -> Vec<u8> {
    let mut objects = page_tree(1, 3);
    objects.push(b"<< /Type /Page /Parent 2 0 R /Resources << >> /Contents 4 0 R >>".to_vec());
    objects.push(stream("", b"BT ET"));
    let mut array = Vec::with_capacity(size);
    array.push(b'[');
    while array.len() + 2 < size {
        array.extend_from_slice(b"0 ");
    }
    array.push(b']');
    objects.push(array);
    pdf(&objects)
}

/// A legitimate PDF of `pages` pages, each showing a line of text and an uncompressed
/// grey image of about `image_bytes` bytes (what a scanned document is).
pub fn pdf_with_images(pages: usize, image_bytes: usize) -> Vec<u8> {
    let side = image_bytes.isqrt();
    let mut objects = page_tree(pages, 4);
    objects.push(
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
            .to_vec(),
    );
    // Pages are objects 4.., then per page its content and image.
    let first_extra = 4 + pages;
    let mut extras = Vec::with_capacity(pages * 2);
    let mut pixels = vec![0u8; side * side];
    for page in 0..pages {
        let content_id = first_extra + page * 2;
        let image_id = content_id + 1;
        objects.push(
            format!(
                "<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 3 0 R >> /XObject << /Im1 {image_id} 0 R >> >> /Contents {content_id} 0 R >>"
            )
            .into_bytes(),
        );
        let content = format!(
            "q 500 0 0 500 56 200 cm /Im1 Do Q BT /F1 12 Tf 72 720 Td (Scanned page {} of {pages}) Tj ET",
            page + 1
        );
        extras.push(stream("", content.as_bytes()));
        // A cheap pseudo-random fill so the image does not compress away.
        let mut state = u32::try_from(page).unwrap_or(0).wrapping_mul(2_654_435_761) | 1;
        for p in &mut pixels {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            *p = state.to_le_bytes()[0];
        }
        extras.push(stream(
            &format!(
                "/Type /XObject /Subtype /Image /Width {side} /Height {side} /ColorSpace /DeviceGray /BitsPerComponent 8"
            ),
            &pixels,
        ));
    }
    objects.extend(extras);
    pdf(&objects)
}

/// `size` bytes of UTF-8 text in numbered lines with accented letters, cut in the middle
/// of a two-byte character when `size` falls there.
pub fn text(size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 64);
    let mut line = 0u64;
    while out.len() < size {
        line += 1;
        out.extend_from_slice(format!("line {line:09}: caf\u{e9} cr\u{e8}me br\u{fb}l\u{e9}e, na\u{ef}ve r\u{e9}sum\u{e9}\n").as_bytes());
    }
    out.truncate(size);
    out
}

/// A compound file (OLE2, version 3: 512-byte sectors, as Office writes them) holding
/// `streams` at its root: the container of .doc, .xls and .ppt files.
pub fn compound_file(streams: &[(&str, &[u8])]) -> Vec<u8> {
    let cursor = std::io::Cursor::new(Vec::new());
    let Ok(mut file) = cfb::CompoundFile::create_with_version(cfb::Version::V3, cursor) else {
        return Vec::new();
    };
    for (name, data) in streams {
        if let Ok(mut stream) = file.create_stream(format!("/{name}")) {
            let _ = stream.write_all(data);
        }
    }
    let _ = file.flush();
    file.into_inner().into_inner()
}

/// A BIFF record (of an .xls `Workbook` stream): type, length, data. Data longer than a
/// record holds (8224 bytes) is cut.
pub fn biff(kind: u16, data: &[u8]) -> Vec<u8> {
    let data = &data[..data.len().min(8224)];
    let mut out = Vec::with_capacity(4 + data.len());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// A `DIMENSIONS` record: rows `first..last` (last exclusive), columns likewise.
pub fn biff_dimensions(first_row: u32, last_row: u32, first_col: u16, last_col: u16) -> Vec<u8> {
    let mut data = Vec::with_capacity(14);
    data.extend_from_slice(&first_row.to_le_bytes());
    data.extend_from_slice(&last_row.to_le_bytes());
    data.extend_from_slice(&first_col.to_le_bytes());
    data.extend_from_slice(&last_col.to_le_bytes());
    data.extend_from_slice(&0u16.to_le_bytes());
    biff(0x0200, &data)
}

/// A `NUMBER` cell record with cell format `xf` (0: General, 1: a date; see [`xls_of`]).
pub fn biff_number(row: u16, col: u16, xf: u16, value: f64) -> Vec<u8> {
    let mut data = Vec::with_capacity(14);
    for n in [row, col, xf] {
        data.extend_from_slice(&n.to_le_bytes());
    }
    data.extend_from_slice(&value.to_le_bytes());
    biff(0x0203, &data)
}

/// A `LABELSST` cell record: shared string `index`.
pub fn biff_label(row: u16, col: u16, index: u32) -> Vec<u8> {
    let mut data = Vec::with_capacity(10);
    for n in [row, col, 0] {
        data.extend_from_slice(&n.to_le_bytes());
    }
    data.extend_from_slice(&index.to_le_bytes());
    biff(0x00FD, &data)
}

/// A `BOOLERR` cell record holding a boolean.
pub fn biff_bool(row: u16, col: u16, value: bool) -> Vec<u8> {
    let mut data = Vec::with_capacity(8);
    for n in [row, col, 0] {
        data.extend_from_slice(&n.to_le_bytes());
    }
    data.extend_from_slice(&[u8::from(value), 0]);
    biff(0x0205, &data)
}

/// A minimal Excel 97-2003 workbook (.xls, BIFF8): a compound file whose `Workbook` stream
/// holds the globals (BOF, the code page, cell formats 0 = General and 1 = the built-in date
/// format 14, the shared `strings`, a `BoundSheet8` per sheet, `extra` records, EOF), then each
/// sheet's substream: BOF, its framed `records` (see [`biff`]), EOF.
pub fn xls_of(strings: &[&str], sheets: &[(&str, Vec<u8>)], extra: &[u8]) -> Vec<u8> {
    let bof = |kind: u16| {
        let mut data = vec![0u8; 16];
        data[..2].copy_from_slice(&0x0600u16.to_le_bytes());
        data[2..4].copy_from_slice(&kind.to_le_bytes());
        biff(0x0809, &data)
    };
    let xf = |format: u16| {
        let mut data = vec![0u8; 20];
        data[2..4].copy_from_slice(&format.to_le_bytes());
        biff(0x00E0, &data)
    };
    let mut sst = Vec::new();
    sst.extend_from_slice(&u32_of(strings.len()).to_le_bytes());
    sst.extend_from_slice(&u32_of(strings.len()).to_le_bytes());
    for s in strings {
        let units: Vec<u16> = s.encode_utf16().collect();
        sst.extend_from_slice(&u16::try_from(units.len()).unwrap_or(0).to_le_bytes());
        sst.push(1); // fHighByte: UTF-16LE characters
        for unit in units {
            sst.extend_from_slice(&unit.to_le_bytes());
        }
    }
    let mut head = bof(0x0005);
    head.extend(biff(0x0042, &1200u16.to_le_bytes()));
    head.extend(xf(0));
    head.extend(xf(14));
    head.extend(biff(0x00FC, &sst));
    head.extend_from_slice(extra);
    // Each BoundSheet8 is 4 + 8 + 2 x name bytes; the sheets follow the globals' EOF.
    let bound_len: usize = sheets
        .iter()
        .map(|(name, _)| 4 + 8 + 2 * name.encode_utf16().count())
        .sum();
    let mut at = head.len() + bound_len + 4;
    let mut bodies = Vec::new();
    for (name, records) in sheets {
        let units: Vec<u16> = name.encode_utf16().collect();
        let mut data = Vec::new();
        data.extend_from_slice(&u32_of(at).to_le_bytes());
        data.extend_from_slice(&[0, 0]); // visible worksheet
        data.push(u8::try_from(units.len()).unwrap_or(0));
        data.push(1);
        for unit in units {
            data.extend_from_slice(&unit.to_le_bytes());
        }
        head.extend(biff(0x0085, &data));
        let mut body = bof(0x0010);
        body.extend_from_slice(records);
        body.extend(biff(0x000A, &[]));
        at += body.len();
        bodies.push(body);
    }
    head.extend(biff(0x000A, &[]));
    for body in bodies {
        head.extend(body);
    }
    compound_file(&[("Workbook", &head)])
}

/// An .xls of one sheet whose `DIMENSIONS` record declares 4 billion rows by 256 columns: a
/// reader that reserves what it declares asks for a trillion cells.
pub fn xls_declaring_dimensions() -> Vec<u8> {
    let mut records = biff_dimensions(0, u32::MAX, 0, 256);
    records.extend(biff_number(0, 0, 0, 1.0));
    xls_of(&[], &[("Sheet1", records)], &[])
}

/// An .xls of `sheets` sheets, each with two numbers: at A1 and at IV65536, the last cell of
/// a BIFF8 sheet. A reader that keeps a dense grid per sheet holds 16.8 million cells each.
pub fn xls_far_corners(sheets: usize) -> Vec<u8> {
    let mut records = biff_number(0, 0, 0, 1.0);
    records.extend(biff_number(65_535, 255, 0, 2.0));
    let sheets: Vec<(String, Vec<u8>)> = (1..=sheets)
        .map(|n| (format!("Sheet{n}"), records.clone()))
        .collect();
    let named: Vec<(&str, Vec<u8>)> = sheets
        .iter()
        .map(|(name, records)| (name.as_str(), records.clone()))
        .collect();
    xls_of(&[], &named, &[])
}
