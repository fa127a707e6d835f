// `ui_hints` -> UiSchemaRenderer 2.0, exactly as the server compiles them for history
// (crates/protocol/src/ui_schema.rs), so a streamed card and a reloaded one are the same.

import type { UiHints, UiNode, UiSchemaRenderer } from "./types";

const STATUSES = new Set(["info", "success", "warning", "error", "pending"]);

export function compileHints(hints: UiHints | null | undefined): UiSchemaRenderer | null {
  if (!hints || typeof hints !== "object") return null;
  const status = hints.status && STATUSES.has(hints.status) ? hints.status : undefined;
  const children: UiNode[] = [];
  if (hints.title) children.push({ type: "text", content: hints.title, role: "title" });
  if (status) children.push({ type: "badge", label: hints.badge ?? status.toUpperCase(), status });
  if (hints.body) children.push({ type: "text", content: hints.body, role: "body" });
  if (hints.fields?.length) {
    children.push({ type: "keyValue", items: hints.fields.map((f) => ({ label: f.label, value: f.value })) });
  }
  if (hints.items?.length) {
    children.push({ type: "list", items: hints.items.map((item) => ({ type: "text", content: item, role: "body" })) });
  }
  for (const link of hints.links ?? []) children.push({ type: "link", label: link.label, href: link.href });
  if (children.length === 0) return null;
  return {
    version: "2.0",
    locale: hints.locale ?? "en-US",
    status: status ?? "info",
    theme: hints.theme ?? "default",
    root: { type: "stack", appearance: "card", children },
  };
}
