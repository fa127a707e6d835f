// A file as a chip (file-attachments.md's AttachmentChip / FileCard): icon coloured by type,
// name and details; activating it asks for a fresh download link and opens it.

import { useState } from "preact/hooks";

import type { FileRef } from "../chat";
import { FILE_TYPES, formatBytes } from "../upload";

export function iconClass(icon?: string, mime?: string): string {
  const kind = icon ?? (mime ? FILE_TYPES[mime]?.icon : undefined) ?? "file";
  return `icon icon-${kind.replace(/[^a-z0-9]/gi, "")}`;
}

export function describe(file: FileRef): string {
  const parts: string[] = [];
  const label = file.mimeType ? FILE_TYPES[file.mimeType]?.label : file.icon?.toUpperCase();
  if (label) parts.push(label);
  if (file.size !== undefined) parts.push(formatBytes(file.size));
  return parts.join(" · ");
}

export function FileChip({ file, open }: { file: FileRef; open: (file: FileRef) => Promise<string> }) {
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const details = describe(file);
  const onClick = async () => {
    setError(null);
    // Opened before the request, so the browser counts it as the click's own window.
    const win = window.open("", "_blank");
    setBusy(true);
    try {
      const url = await open(file);
      if (win) {
        win.opener = null;
        win.location.href = url;
      } else {
        location.assign(url);
      }
    } catch (e) {
      win?.close();
      setError(e instanceof Error ? e.message : String(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <span class="chip-wrap">
      <button
        type="button"
        class="chip"
        onClick={onClick}
        disabled={!file.contentUrl || busy}
        aria-label={`Open ${file.name}${details ? ` (${details})` : ""}`}
      >
        <span class={iconClass(file.icon, file.mimeType)} aria-hidden="true" />
        <span class="chip-name">{file.name}</span>
        {details && <span class="chip-meta">{details}</span>}
      </button>
      {error && (
        <span class="chip-error" role="alert">
          Could not open {file.name}: {error}
        </span>
      )}
    </span>
  );
}
