// The upload flow of file-attachments.md: SHA-256 in the page, `POST /v2/files/upload-url`,
// a duplicate answered without upload, otherwise the presigned POST straight to S3 with
// progress. The attachments service verifies every stored object (size, SHA-256, type) before
// a run may use it, so what the browser claims is never trusted on its own.

import { Api, ApiError } from "./api";

/** Most files per message and bytes per file (the service's limits). */
export const MAX_FILES = 3;
export const MAX_BYTES = 100 * 1024 * 1024;

/** The types the service accepts, by MIME type, with a short label and the chip's icon. */
export const FILE_TYPES: Record<string, { label: string; icon: string }> = {
  "application/pdf": { label: "PDF", icon: "pdf" },
  "application/msword": { label: "DOC", icon: "doc" },
  "application/vnd.openxmlformats-officedocument.wordprocessingml.document": { label: "DOCX", icon: "doc" },
  "application/vnd.ms-excel": { label: "XLS", icon: "xls" },
  "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": { label: "XLSX", icon: "xls" },
  "application/vnd.ms-powerpoint": { label: "PPT", icon: "ppt" },
  "application/vnd.openxmlformats-officedocument.presentationml.presentation": { label: "PPTX", icon: "ppt" },
  "image/png": { label: "PNG", icon: "image" },
  "image/jpeg": { label: "JPEG", icon: "image" },
  "image/gif": { label: "GIF", icon: "image" },
  "image/webp": { label: "WebP", icon: "image" },
  "image/bmp": { label: "BMP", icon: "image" },
  "image/svg+xml": { label: "SVG", icon: "image" },
  "text/csv": { label: "CSV", icon: "csv" },
  "text/plain": { label: "TXT", icon: "txt" },
};

const BY_EXTENSION: Record<string, string> = {
  pdf: "application/pdf",
  doc: "application/msword",
  docx: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
  xls: "application/vnd.ms-excel",
  xlsx: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
  ppt: "application/vnd.ms-powerpoint",
  pptx: "application/vnd.openxmlformats-officedocument.presentationml.presentation",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  bmp: "image/bmp",
  svg: "image/svg+xml",
  csv: "text/csv",
  txt: "text/plain",
  md: "text/plain",
};

/** `accept` of the file input. */
export const ACCEPT = [...Object.keys(FILE_TYPES), ...Object.keys(BY_EXTENSION).map((e) => `.${e}`)].join(",");

/** The MIME type the service will be told, or null when it does not take the file. */
export function fileType(file: File): string | null {
  if (file.type && FILE_TYPES[file.type]) return file.type;
  const ext = file.name.includes(".") ? file.name.split(".").pop()!.toLowerCase() : "";
  if (!file.type || file.type === "application/octet-stream") return BY_EXTENSION[ext] ?? null;
  return null;
}

export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

/** Splits a selection into the files that can be sent and a clear reason for each that can't. */
export function checkSelection(alreadyAttached: number, files: File[]): { accepted: { file: File; type: string }[]; errors: string[] } {
  const accepted: { file: File; type: string }[] = [];
  const errors: string[] = [];
  for (const file of files) {
    const type = fileType(file);
    if (type === null) {
      errors.push(`${file.name}: this type of file is not supported (PDF, Word, Excel, PowerPoint, images, CSV and text are).`);
    } else if (file.size > MAX_BYTES) {
      errors.push(`${file.name}: ${formatBytes(file.size)} is over the 100 MB limit per file.`);
    } else if (file.size === 0) {
      errors.push(`${file.name}: the file is empty.`);
    } else if (alreadyAttached + accepted.length >= MAX_FILES) {
      errors.push(`${file.name}: at most ${MAX_FILES} files can be sent with one message.`);
    } else {
      accepted.push({ file, type });
    }
  }
  return { accepted, errors };
}

export async function sha256Hex(file: Blob): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

export type UploadPhase =
  | { kind: "hashing" }
  | { kind: "uploading"; fraction: number | null }
  | { kind: "verifying" }
  | { kind: "done"; duplicate: boolean; contentUrl: string }
  | { kind: "error"; message: string };

/** Runs the whole flow for one file, reporting each phase; resolves with the `content_url`. */
export async function uploadFile(
  api: Api,
  file: File,
  type: string,
  report: (phase: UploadPhase) => void,
): Promise<string> {
  report({ kind: "hashing" });
  const hash = await sha256Hex(file);
  const answer = await api.uploadUrl({
    file_name: file.name,
    file_type: type,
    file_size: file.size,
    content_hash: hash,
  });
  if (!answer.upload_required || answer.url === null || answer.fields === null) {
    report({ kind: "done", duplicate: true, contentUrl: answer.content_url });
    return answer.content_url;
  }
  report({ kind: "uploading", fraction: 0 });
  const form = new FormData();
  for (const [name, value] of Object.entries(answer.fields)) form.append(name, value);
  form.append("file", file);
  const outcome = await postWithProgress(answer.url, form, (fraction) => report({ kind: "uploading", fraction }));
  if (outcome === "opaque") {
    // The storage answered without CORS headers, so the page could not read its status: ask
    // the attachments service, which verifies the stored object (size, SHA-256, type) now.
    report({ kind: "verifying" });
    await api.downloadUrl(answer.content_url);
  }
  report({ kind: "done", duplicate: false, contentUrl: answer.content_url });
  return answer.content_url;
}

/**
 * POSTs the form to S3 with an XMLHttpRequest, whose upload events drive the progress bar.
 * That needs the bucket's CORS rule (deploy/k8s/infra/s3/cors.json). A storage without CORS
 * refuses the preflight before any byte is sent; then the same form goes as a `no-cors` fetch
 * (the seed's own request) with an indeterminate bar, and "opaque" tells the caller to confirm.
 */
function postWithProgress(url: string, form: FormData, progress: (fraction: number | null) => void): Promise<"ok" | "opaque"> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    let sent = 0;
    let total = 0;
    xhr.upload.onprogress = (event) => {
      sent = event.loaded;
      total = event.total;
      if (event.lengthComputable) progress(event.loaded / event.total);
    };
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) {
        progress(1);
        resolve("ok");
      } else {
        const reason = /<Message>([^<]*)<\/Message>/.exec(xhr.responseText)?.[1];
        reject(new Error(`the storage refused the upload (${xhr.status}${reason ? `: ${reason}` : ""})`));
      }
    };
    xhr.onerror = () => {
      if (sent > 0 && sent === total) {
        // Every byte went, but the answer could not be read: let the service confirm.
        resolve("opaque");
        return;
      }
      if (sent > 0) {
        reject(new Error("the connection to the storage was lost during the upload"));
        return;
      }
      progress(null);
      fetch(url, { method: "POST", body: form, mode: "no-cors" })
        .then(() => resolve("opaque"))
        .catch(() => reject(new Error("the storage could not be reached")));
    };
    xhr.open("POST", url);
    xhr.send(form);
  });
}

/** A readable message for a failed upload. */
export function uploadError(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}
