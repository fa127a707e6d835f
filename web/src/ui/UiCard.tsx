// Renders a UiSchemaRenderer 2.0 (agent-run-input-protocol.md) as a card: a stack of title
// and body text, a status badge, key/values, lists and links. Unknown node types are skipped.

import type { UiNode, UiSchemaRenderer } from "../types";

function Node({ node }: { node: UiNode }) {
  switch (node.type) {
    case "stack": {
      const n = node as Extract<UiNode, { type: "stack" }>;
      return (
        <div class={`ui-stack ui-appearance-${n.appearance ?? "plain"}`}>
          {(n.children ?? []).map((child, i) => (
            <Node key={i} node={child} />
          ))}
        </div>
      );
    }
    case "text": {
      const n = node as Extract<UiNode, { type: "text" }>;
      if (n.role === "title") return <h3 class="ui-title">{n.content}</h3>;
      if (n.role === "caption") return <p class="ui-caption">{n.content}</p>;
      return <p class="ui-body">{n.content}</p>;
    }
    case "badge": {
      const n = node as Extract<UiNode, { type: "badge" }>;
      return <span class={`ui-badge ui-badge-${n.status ?? "info"}`}>{n.label}</span>;
    }
    case "keyValue": {
      const n = node as Extract<UiNode, { type: "keyValue" }>;
      return (
        <dl class="ui-kv">
          {n.items.map((item, i) => (
            <div key={i}>
              <dt>{item.label}</dt>
              <dd>{item.value}</dd>
            </div>
          ))}
        </dl>
      );
    }
    case "list": {
      const n = node as Extract<UiNode, { type: "list" }>;
      return (
        <ul class="ui-list">
          {n.items.map((item, i) => (
            <li key={i}>
              <Node node={item} />
            </li>
          ))}
        </ul>
      );
    }
    case "link": {
      const n = node as Extract<UiNode, { type: "link" }>;
      if (!/^https?:\/\//.test(n.href)) return <span>{n.label}</span>;
      return (
        <a class="ui-link" href={n.href} target="_blank" rel="noopener noreferrer">
          {n.label}
        </a>
      );
    }
    default:
      return null;
  }
}

export function UiCard({ schema }: { schema: UiSchemaRenderer }) {
  const title = findTitle(schema.root);
  return (
    <section
      class={`ui-card ui-status-${schema.status} ui-theme-${schema.theme}`}
      lang={schema.locale}
      aria-label={title ? `Card: ${title}` : "Card"}
      data-ui-version={schema.version}
    >
      <Node node={schema.root} />
    </section>
  );
}

function findTitle(node: UiNode): string | null {
  if (node.type === "text" && (node as { role?: string }).role === "title") return (node as { content: string }).content;
  for (const child of ((node as { children?: UiNode[] }).children ?? [])) {
    const title = findTitle(child);
    if (title) return title;
  }
  return null;
}
