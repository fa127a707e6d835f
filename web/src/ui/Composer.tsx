// The message box: text, up to 3 files uploaded as soon as they are picked (hash, upload-url,
// presigned POST with progress), Send, and Stop while a reply streams.

import { useRef, useState } from "preact/hooks";

import type { Draft, RunStatus } from "../chat";
import { ACCEPT, FILE_TYPES, formatBytes, MAX_FILES } from "../upload";
import { iconClass } from "./FileChip";

interface Props {
  drafts: Draft[];
  errors: string[];
  runStatus: RunStatus;
  canSend: boolean;
  promptPending: boolean;
  onFiles: (files: File[]) => void;
  onRemove: (id: string) => void;
  onSend: (text: string) => boolean;
  onStop: () => void;
}

function DraftChip({ draft, onRemove }: { draft: Draft; onRemove: (id: string) => void }) {
  const { phase } = draft;
  let status;
  switch (phase.kind) {
    case "hashing":
      status = <span class="draft-status">Computing SHA-256…</span>;
      break;
    case "uploading":
      status = (
        <span class="draft-status">
          <progress
            max={1}
            value={phase.fraction ?? undefined}
            aria-label={`Uploading ${draft.file.name}`}
          />
          <span>{phase.fraction === null ? "Uploading…" : `${Math.round(phase.fraction * 100)}%`}</span>
        </span>
      );
      break;
    case "verifying":
      status = <span class="draft-status">Checking the upload…</span>;
      break;
    case "done":
      status = <span class="draft-status ok">{phase.duplicate ? "Already uploaded: no upload needed" : "Uploaded"}</span>;
      break;
    case "error":
      status = (
        <span class="draft-status bad" role="alert">
          {phase.message}
        </span>
      );
      break;
  }
  return (
    <li class={`draft draft-${phase.kind}`} data-file={draft.file.name}>
      <span class={iconClass(undefined, draft.type)} aria-hidden="true" />
      <span class="draft-name">
        {draft.file.name}
        <span class="chip-meta">
          {FILE_TYPES[draft.type]?.label} · {formatBytes(draft.file.size)}
        </span>
      </span>
      {status}
      <button type="button" class="icon-button" aria-label={`Remove ${draft.file.name}`} onClick={() => onRemove(draft.id)}>
        ×
      </button>
    </li>
  );
}

export function Composer(props: Props) {
  const [text, setText] = useState("");
  const input = useRef<HTMLInputElement>(null);
  const running = props.runStatus !== null;
  const uploading = props.drafts.some((d) => d.phase.kind !== "done");
  const submit = (event?: Event) => {
    event?.preventDefault();
    if (props.onSend(text)) setText("");
  };
  const hint = props.promptPending
    ? "Answer or dismiss the agent's question first."
    : uploading
      ? "Waiting for the files to finish uploading."
      : "";
  return (
    <form class="composer" onSubmit={submit} aria-label="New message">
      {props.errors.length > 0 && (
        <ul class="composer-errors" role="alert">
          {props.errors.map((error, i) => (
            <li key={i}>{error}</li>
          ))}
        </ul>
      )}
      {props.drafts.length > 0 && (
        <ul class="drafts" aria-label="Files to send">
          {props.drafts.map((draft) => (
            <DraftChip key={draft.id} draft={draft} onRemove={props.onRemove} />
          ))}
        </ul>
      )}
      <div class="composer-row">
        <input
          ref={input}
          id="file-input"
          type="file"
          multiple
          accept={ACCEPT}
          class="visually-hidden"
          tabIndex={-1}
          aria-hidden="true"
          onChange={(e) => {
            const target = e.target as HTMLInputElement;
            props.onFiles(Array.from(target.files ?? []));
            target.value = "";
          }}
        />
        <button
          type="button"
          class="icon-button attach"
          aria-label={`Attach files (up to ${MAX_FILES})`}
          title={`Attach files (up to ${MAX_FILES})`}
          onClick={() => input.current?.click()}
        >
          <svg aria-hidden="true" width="20" height="20" viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">
            <path d="M21.44 11.05l-9.19 9.19a6 6 0 0 1-8.49-8.49l9.19-9.19a4 4 0 0 1 5.66 5.66l-9.2 9.19a2 2 0 0 1-2.83-2.83l8.49-8.48" />
          </svg>
        </button>
        <label for="message-text" class="visually-hidden">
          Message
        </label>
        <textarea
          id="message-text"
          rows={1}
          value={text}
          placeholder="Message the agent"
          aria-describedby={hint ? "composer-hint" : undefined}
          onInput={(e) => setText((e.target as HTMLTextAreaElement).value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
              e.preventDefault();
              submit();
            }
          }}
        />
        {running ? (
          <button type="button" class="stop" onClick={props.onStop} disabled={props.runStatus === "stopping"}>
            {props.runStatus === "stopping" ? "Stopping…" : "Stop"}
          </button>
        ) : (
          <button type="submit" class="primary send" disabled={!props.canSend || (!text.trim() && props.drafts.length === 0)}>
            Send
          </button>
        )}
      </div>
      {hint && (
        <p id="composer-hint" class="composer-hint">
          {hint}
        </p>
      )}
    </form>
  );
}
