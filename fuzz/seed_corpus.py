#!/usr/bin/env python3
"""Writes seed inputs for every fuzz target into fuzz/corpus/<target>/ (git-ignored).

Run from anywhere: `python3 fuzz/seed_corpus.py`. Seeds come from the protocol's golden
vectors and from small well-formed files built here (PDF, DOCX, XLSX, PPTX, PNG, BMP, ...), so
that a 60-second run starts past the "is it even JSON / a zip / a PDF" stage. Existing corpus
files are kept; seeds are rewritten.
"""

import io
import json
import struct
import zipfile
import zlib
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
VECTORS = FUZZ.parent / "crates" / "protocol" / "tests" / "vectors"
CORPUS = FUZZ / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (folder / f"seed-{name}").write_bytes(data)


def compact(path):
    return json.dumps(json.loads(path.read_text()), separators=(",", ":"))


def run_input():
    for path in sorted(VECTORS.glob("run-input-*.json")):
        write("parse_run_input", path.stem, compact(path))


def ws_inbound():
    messages = {
        "text": {"type": "user_message", "id": "m1", "conversation_id": "c1",
                 "content": {"messages": [{"role": "user", "content": "hello"}]}},
        "parts": {"type": "user_message", "id": "m2", "conversation_id": "c1",
                  "schema_type": "string",
                  "content": {"messages": [
                      {"role": "assistant", "content": "earlier"},
                      {"role": "user", "content": [
                          {"type": "text", "text": "what is this?"},
                          {"type": "image_url", "image_url": {"url": "s3://bucket/uploads/a.png"}}]}]}},
        "interaction": {"type": "user_interaction_message", "id": "m3", "conversation_id": "c1",
                        "parent_id": "p1",
                        "content": {"messages": [{"role": "user", "content": "yes"}]}},
        "chat": {"type": "chat", "message": "summarise", "session_id": "s1",
                 "content_urls": ["s3://bucket/uploads/u/f/report.pdf"]},
        "server": {"type": "error_message", "id": "x"},
        "data-url": {"type": "user_message", "id": "m", "conversation_id": "c",
                     "content": {"messages": [{"role": "user", "content": [
                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]}},
    }
    for name, message in messages.items():
        write("ws_inbound", name, json.dumps(message, separators=(",", ":")))


def file_url():
    urls = [
        "s3://bucket/uploads/user123/file456/bao-cao.pdf",
        "https://xxx.supabase.co/storage/v1/object/sign/agent-files/agent-inputs/u/t/r/img.jpg?token=xxx",
        "http://127.0.0.1:59000/switchboard/uploads/a%20b.png?X-Amz-Signature=abc",
        "s3://bucket/uploads/%2E%2E/secret",
        "https://h/b/a/./c",
        "s3://b/k%00ey",
    ]
    for index, url in enumerate(urls):
        write("file_url", str(index), url)


def message_body():
    for kind in ("chat", "multimodal", "researcher", "software"):
        body = VECTORS / f"message-body-{kind}-message.json"
        schema = VECTORS / f"message-body-{kind}-schema.json"
        if body.exists() and schema.exists():
            documents = (compact(body), compact(schema), compact(schema))
            write("message_body", kind, b"\xff".join(d.encode() for d in documents))
    # Hand-made: named parts, globs, braces and a remote part.
    body = {"parts": [
        {"contentType": "text/plain; charset=utf-8", "content": "hi"},
        {"name": "/sources/1.json", "contentType": "application/json", "content": "{}"},
        {"name": "/img/a.png", "contentType": "image/png", "contentUrl": "s3://b/k.png"}]}
    out = {"parts": [
        {"contentType": "text/plain", "required": True},
        {"name": "/sources/{1,2}.json", "contentType": "application/json"},
        {"name": "/img/*", "contentType": "image/*"}]}
    wide = {"parts": [{"contentType": "*/*"}, {"name": "/**", "contentType": "**"}]}
    seed = b"\xff".join(json.dumps(d, separators=(",", ":")).encode() for d in (body, out, wide))
    write("message_body", "globs", seed)


def form(parts, boundary="B0UNDARY"):
    out = b""
    for headers, data in parts:
        out += b"--" + boundary.encode() + b"\r\n" + headers + b"\r\n\r\n" + data + b"\r\n"
    return out + b"--" + boundary.encode() + b"--\r\n"


def multipart():
    upload = form([
        (b'Content-Disposition: form-data; name="session_id"', b"s1"),
        (b'Content-Disposition: form-data; name="file_type"', b"application/pdf"),
        (b'Content-Disposition: form-data; name="extra"', b"x"),
        (b'Content-Disposition: form-data; name="file"; filename="a.pdf"\r\nContent-Type: application/pdf',
         b"%PDF-1.4\n%%EOF"),
    ])
    write("multipart", "upload-whole", b"\x3f" + upload)
    write("multipart", "upload-chunked", b"\x02" + upload)
    header = b"multipart/form-data; boundary=\"a b\"\n"
    write("multipart", "header", b"\x45" + header + form(
        [(b'Content-Disposition: form-data; name="file"; filename="x.png"\r\nContent-Type: image/png',
          b"\x89PNG\r\n\x1a\n")], boundary="a b"))
    write("multipart", "truncated", b"\x07" + upload[: len(upload) // 2])


def zip_of(entries):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


def pdf(text, compress):
    content = f"BT /F1 12 Tf 72 712 Td ({text}) Tj ET".encode()
    stream = zlib.compress(content) if compress else content
    filters = b"/Filter /FlateDecode " if compress else b""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< " + filters + b"/Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream
        + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return out


def png():
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def bmp():
    rows = b"\x00\x00\xff\xff\xff\xff\x00\x00" * 2  # 2x2, 24-bit, rows padded to 4 bytes
    info = struct.pack("<IiiHHIIiiII", 40, 2, 2, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info) + len(rows), 0, 0, 14 + len(info)) + info + rows


# Selector bytes of the extract target: a TYPES index (below 0x80), or from 0x80 on a byte
# whose remainder by len(EXTENSIONS) is an EXTENSIONS index.
PDF, DOCX, XLSX, PPTX, TXT, CSV, PNG, JPEG, GIF, WEBP, BMP, SVG, DOC = range(13)
EXTENSIONS = 17


def by_extension(index):
    return 0x80 + (index - 0x80) % EXTENSIONS


def extract():
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    docx = zip_of([("[Content_Types].xml", "<Types/>"),
                   ("word/document.xml",
                    f'<w:document xmlns:w="{w}"><w:body><w:p><w:r><w:t>Hello</w:t></w:r></w:p>'
                    f'<w:p><w:r><w:t>world</w:t></w:r></w:p></w:body></w:document>')])
    s = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
    xlsx = zip_of([
        ("xl/workbook.xml", f'<workbook xmlns="{s}" xmlns:r="http://schemas.openxmlformats.org/'
                            'officeDocument/2006/relationships"><sheets><sheet name="S" sheetId="1" '
                            'r:id="rId1"/></sheets></workbook>'),
        ("xl/_rels/workbook.xml.rels", '<Relationships><Relationship Id="rId1" Type="worksheet" '
                                       'Target="worksheets/sheet1.xml"/></Relationships>'),
        ("xl/sharedStrings.xml", f'<sst xmlns="{s}"><si><t>Name</t></si></sst>'),
        ("xl/worksheets/sheet1.xml", f'<worksheet xmlns="{s}"><sheetData><row r="1"><c r="A1" t="s">'
                                     '<v>0</v></c><c r="B1"><v>4.5</v></c></row></sheetData></worksheet>'),
    ])
    pptx = zip_of([("ppt/slides/slide1.xml",
                    '<p:sld xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" '
                    'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"><p:cSld>'
                    '<p:spTree><p:sp><p:txBody><a:p><a:r><a:t>Slide</a:t></a:r></a:p></p:txBody>'
                    '</p:sp></p:spTree></p:cSld></p:sld>')])
    seeds = {
        "pdf": bytes([PDF]) + pdf("Hello PDF", False),
        "pdf-flate": bytes([PDF]) + pdf("Hello flate", True),
        "docx": bytes([DOCX]) + docx,
        "xlsx": bytes([XLSX]) + xlsx,
        "pptx": bytes([PPTX]) + pptx,
        "txt": bytes([TXT]) + "plain text, ünïcode\n".encode(),
        "csv-bom": bytes([CSV]) + b"\xef\xbb\xbfa,b\n1,2\n",
        "utf16": bytes([TXT]) + b"\xff\xfeh\x00i\x00",
        "png": bytes([PNG]) + png(),
        "jpeg": bytes([JPEG]) + b"\xff\xd8\xff\xe0\x00\x10JFIF\x00",
        "gif": bytes([GIF]) + b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
        "webp": bytes([WEBP]) + b"RIFF\x0c\x00\x00\x00WEBPVP8 ",
        "bmp": bytes([BMP]) + bmp(),
        "svg": bytes([SVG]) + b"<svg/>",
        "doc": bytes([DOC]) + b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1",
        "ext-docx": bytes([by_extension(1)]) + docx,
        "ext-md": bytes([by_extension(6)]) + b"# title\n",
    }
    for name, data in seeds.items():
        write("extract", name, data)


if __name__ == "__main__":
    run_input()
    ws_inbound()
    file_url()
    message_body()
    multipart()
    extract()
    for folder in sorted(CORPUS.iterdir()):
        print(f"{folder.relative_to(FUZZ)}: {len(list(folder.iterdir()))} files")
