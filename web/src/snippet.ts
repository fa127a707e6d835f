// A search hit's snippet as text parts, never as HTML. The server (history's search.rs) escapes
// the message text (`&amp;` `&lt;` `&gt;` `&quot;` `&#39;`) and wraps each match in
// `<mark>`…`</mark>`: so the only `<` in a snippet start a mark tag. The snippet is split on
// those tags and each part unescaped into plain text, which the view renders as text nodes and
// <mark> elements. Whatever else the string holds stays text.

/** A run of a snippet's text, and whether it is a match. */
export interface SnippetPart {
  text: string;
  marked: boolean;
}

const NAMED: Record<string, string> = { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'" };

/** `text` with its character references replaced, in one pass (`&amp;lt;` is `&lt;`, not `<`). */
export function unescapeHtml(text: string): string {
  return text.replace(/&(?:#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6})|([a-zA-Z]+));/g, (entity, dec?: string, hex?: string, name?: string) => {
    if (name !== undefined) return NAMED[name.toLowerCase()] ?? entity;
    const code = dec !== undefined ? Number.parseInt(dec, 10) : Number.parseInt(hex!, 16);
    return code > 0 && code <= 0x10ffff && (code < 0xd800 || code > 0xdfff) ? String.fromCodePoint(code) : entity;
  });
}

/** The parts of `snippet`, in order; empty parts left out, adjacent parts of one kind merged. */
export function snippetParts(snippet: string): SnippetPart[] {
  const parts: SnippetPart[] = [];
  let marked = false;
  for (const piece of snippet.split(/(<\/?mark>)/i)) {
    const tag = piece.toLowerCase();
    if (tag === "<mark>") marked = true;
    else if (tag === "</mark>") marked = false;
    else if (piece) {
      const text = unescapeHtml(piece);
      const last = parts.at(-1);
      if (last && last.marked === marked) last.text += text;
      else parts.push({ text, marked });
    }
  }
  return parts;
}
