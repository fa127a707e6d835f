// End-to-end test of the web client in headless Chromium (Debian's, driven by playwright-core),
// through the gateway, against the real services. Run by tests/system/web.rs; by hand:
//
//   SB_WEB_URL=http://127.0.0.1:8080 SB_TOKEN=$(scripts/token.sh alice) node web/e2e/run.mjs
//
// Environment: SB_WEB_URL (the gateway's origin), SB_TOKEN (a bearer token), SB_S3_URL (the S3
// endpoint the upload forms point at), SB_SCREENSHOTS (folder for the PNGs; none when unset),
// SB_DAYS_THREAD (a thread whose messages span several days, listed after a full page of
// threads: the history and thread-list paging checks), SB_DAYS (its days, newest first, comma
// separated), SB_RENDER_RUNS (page loads timed for the first render, default 5),
// SB_ONLY_RENDER=1 (time the first render only: the BENCHMARKS.md figures).
// Prints one JSON report on stdout ({ok, failures, steps, facts, firstRender}); exits 0 when
// every check passed, 1 when one failed, 2 when the browser could not be driven.
// Waits are for DOM states and network events, each with a timeout; nothing sleeps.

import { createHash } from "node:crypto";
import { closeSync, ftruncateSync, mkdirSync, openSync, readFileSync, readdirSync, readlinkSync, unlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { deflateSync } from "node:zlib";
import { chromium } from "playwright-core";

const CHROMIUM = process.env.SB_CHROMIUM || "/usr/bin/chromium";
const ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
const ORIGIN = (process.env.SB_WEB_URL || "http://127.0.0.1:8080").replace(/\/$/, "");
const TOKEN = process.env.SB_TOKEN;
const S3_URL = process.env.SB_S3_URL ? new URL(process.env.SB_S3_URL).origin : null;
const SHOTS = process.env.SB_SCREENSHOTS || null;
const DAYS_THREAD = process.env.SB_DAYS_THREAD || null;
const DAYS = (process.env.SB_DAYS || "").split(",").filter(Boolean);
const RENDER_RUNS = Number(process.env.SB_RENDER_RUNS || 5);
const WAIT = 20_000;
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };

const report = { ok: false, failures: [], steps: [], facts: {}, firstRender: null, screenshots: [] };

function fail(message) {
  throw new Error(message);
}
function expect(condition, message) {
  if (!condition) fail(message);
}

/** Runs one check; a failed `critical` one ends the flow (everything after needs it). */
async function step(name, body, { critical = false } = {}) {
  const started = Date.now();
  try {
    await body();
    report.steps.push({ name, ok: true, ms: Date.now() - started });
  } catch (error) {
    const message = `${name}: ${error?.message ?? error}`.split("\n").slice(0, 6).join("\n");
    report.steps.push({ name, ok: false, ms: Date.now() - started, error: message });
    report.failures.push(message);
    if (critical) throw new Critical(message);
  }
}
class Critical extends Error {}

async function shot(page, name) {
  if (!SHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  const path = join(SHOTS, `${name}.png`);
  await page.screenshot({ path, animations: "disabled", caret: "hide" });
  report.screenshots.push(path);
}

// ------------------------------------------------------------------ test files

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

/** A one-page PDF showing `text` (the same shape as tests/system/attachment_content.rs). */
function pdfWithText(text) {
  const content = `BT /F1 12 Tf 72 700 Td (${text}) Tj ET`;
  const objects = [
    "<< /Type /Catalog /Pages 2 0 R >>",
    "<< /Type /Pages /Kids [3 0 R] /Count 1 /MediaBox [0 0 612 792] >>",
    "<< /Type /Page /Parent 2 0 R /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
    "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    `<< /Length ${content.length} >>\nstream\n${content}\nendstream`,
  ];
  let pdf = "%PDF-1.4\n";
  const offsets = [];
  objects.forEach((object, i) => {
    offsets.push(pdf.length);
    pdf += `${i + 1} 0 obj\n${object}\nendobj\n`;
  });
  const xref = pdf.length;
  pdf += `xref\n0 ${objects.length + 1}\n0000000000 65535 f \n`;
  for (const offset of offsets) pdf += `${String(offset).padStart(10, "0")} 00000 n \n`;
  pdf += `trailer\n<< /Size ${objects.length + 1} /Root 1 0 R >>\nstartxref\n${xref}\n%%EOF\n`;
  return Buffer.from(pdf, "latin1");
}

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function chunk(type, data) {
  const length = Buffer.alloc(4);
  length.writeUInt32BE(data.length);
  const body = Buffer.concat([Buffer.from(type, "ascii"), data]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body));
  return Buffer.concat([length, body, crc]);
}
/** An RGB PNG of noise over a gradient: large enough (about 1.4 MB) for a visible upload. */
function noisyPng(width, height, seed) {
  let state = seed >>> 0 || 1;
  const random = () => ((state = (state * 1664525 + 1013904223) >>> 0) >>> 24);
  const rows = [];
  for (let y = 0; y < height; y++) {
    const row = Buffer.alloc(1 + width * 3);
    for (let x = 0; x < width; x++) {
      row[1 + x * 3] = (x * 255) / width;
      row[2 + x * 3] = random();
      row[3 + x * 3] = (y * 255) / height;
    }
    rows.push(row);
  }
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 2, 0, 0, 0], 8);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", header),
    chunk("IDAT", deflateSync(Buffer.concat(rows), { level: 0 })),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

// ------------------------------------------------------------------ the gateway's connections

/**
 * Cuts every connection the gateway holds, as a network drop does: SIGKILL to the nginx worker
 * that listens on the gateway's port (found through /proc); its master starts a new worker.
 */
function dropGatewayConnections() {
  const port = Number(new URL(ORIGIN).port || 80);
  const hexPort = port.toString(16).toUpperCase().padStart(4, "0");
  const inodes = new Set();
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let table = "";
    try {
      table = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    for (const line of table.split("\n").slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols.length > 9 && cols[1].endsWith(`:${hexPort}`) && cols[3] === "0A") inodes.add(cols[9]);
    }
  }
  const holders = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    let fds = [];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      let target = "";
      try {
        target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
      if (inode && inodes.has(inode)) {
        holders.push(Number(pid));
        break;
      }
    }
  }
  const parent = (pid) => Number(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ")[1]);
  const workers = holders.filter((pid) => holders.includes(parent(pid)));
  expect(workers.length > 0, `no nginx worker found listening on port ${port} (holders ${holders})`);
  for (const pid of workers) process.kill(pid, "SIGKILL");
  return workers;
}

// ------------------------------------------------------------------ page helpers

async function newPage(browser, viewport, extra = {}) {
  const context = await browser.newContext({ viewport, locale: "en-US", timezoneId: "UTC", ...extra });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT);
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") process.stderr.write(`[page ${m.type()}] ${m.text()}\n`);
  });
  page.on("pageerror", (e) => {
    process.stderr.write(`[page error] ${e.message}\n`);
    report.facts.pageErrors = [...(report.facts.pageErrors ?? []), e.message];
  });
  return { context, page };
}

/** Watches the network: upload-url bodies and answers, S3 POSTs, event-stream resumes. */
function watch(page) {
  const seen = { uploadUrl: [], s3Posts: [], resumes: [], runs: [] };
  const forms = new Map();
  page.on("request", (request) => {
    const url = request.url();
    if (url.endsWith("/v2/files/upload-url")) {
      const entry = { body: request.postDataJSON(), answer: null };
      forms.set(request, entry);
      seen.uploadUrl.push(entry);
    }
    if (S3_URL && url.startsWith(S3_URL) && request.method() === "POST") seen.s3Posts.push({ url, status: null });
    if (/\/api\/v1\/agent\/runs\/[^/]+\/events$/.test(new URL(url).pathname)) {
      seen.resumes.push({ run: decodeURIComponent(url.split("/runs/")[1].split("/")[0]), lastEventId: request.headers()["last-event-id"] ?? null, at: Date.now() });
    }
    if (url.endsWith("/api/v1/agent/ag-ui")) seen.runs.push(request.postDataJSON());
  });
  page.on("response", async (response) => {
    const url = response.url();
    const entry = forms.get(response.request());
    if (entry) entry.answer = await response.json().catch(() => null);
  });
  const s3Done = (request, status) => {
    if (!S3_URL || !request.url().startsWith(S3_URL) || request.method() !== "POST") return;
    const entry = seen.s3Posts.find((p) => p.url === request.url() && p.status === null);
    if (entry) entry.status = status;
  };
  page.on("requestfinished", async (request) => s3Done(request, (await request.response())?.status() ?? null));
  page.on("requestfailed", (request) => s3Done(request, `failed: ${request.failure()?.errorText}`));
  return seen;
}

const assistantTexts = (page) => page.$$eval(".msg-assistant .msg-text", (els) => els.map((e) => e.textContent));
const lastAssistant = (page) => page.$$eval(".msg-assistant .msg-text", (els) => els.at(-1)?.textContent ?? null);

/** Types `text` in the message box and sends it with Enter. */
async function send(page, text) {
  await page.fill("#message-text", text);
  await page.press("#message-text", "Enter");
}

/** Waits until the last assistant message is exactly `text` and the run is over. */
async function replyIs(page, text, timeout = WAIT) {
  await page.waitForFunction(
    (want) => {
      const texts = [...document.querySelectorAll(".msg-assistant .msg-text")].map((e) => e.textContent);
      const status = document.querySelector(".run-status")?.getAttribute("data-status");
      return texts.at(-1) === want && status === "idle" && !document.querySelector('.msg[aria-busy="true"]');
    },
    text,
    { timeout },
  );
}

/** Records every distinct text the last assistant message shows while `body` runs. */
async function recordStream(page, body) {
  await page.evaluate(() => {
    window.__texts = [];
    window.__observer?.disconnect();
    window.__observer = new MutationObserver(() => {
      const text = [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? "";
      if (window.__texts.at(-1) !== text) window.__texts.push(text);
    });
    window.__observer.observe(document.querySelector(".messages"), { subtree: true, childList: true, characterData: true });
  });
  await body();
  return page.evaluate(() => {
    window.__observer.disconnect();
    return window.__texts;
  });
}

const words = (prefix, n) => Array.from({ length: n }, (_, i) => `${prefix}${i}`).join(" ");

// ------------------------------------------------------------------ first render

async function measureFirstRender(browser) {
  const runs = [];
  for (let i = 0; i < RENDER_RUNS; i++) {
    const { context, page } = await newPage(browser, DESKTOP);
    await page.goto(`${ORIGIN}/#token=${TOKEN}`);
    await page.waitForSelector("html[data-ready] .thread-list");
    runs.push(
      await page.evaluate(() => {
        const nav = performance.getEntriesByType("navigation")[0];
        const fcp = performance.getEntriesByName("first-contentful-paint")[0];
        const ready = performance.getEntriesByName("sb:ready")[0];
        const scripts = performance.getEntriesByType("resource").filter((r) => /\.(js|css)$/.test(r.name));
        return {
          firstContentfulPaintMs: fcp ? Math.round(fcp.startTime) : null,
          threadsShownMs: ready ? Math.round(ready.startTime) : null,
          domContentLoadedMs: Math.round(nav.domContentLoadedEventEnd),
          assetsTransferred: scripts.reduce((n, r) => n + r.transferSize, 0),
        };
      }),
    );
    await context.close();
  }
  const stat = (key) => {
    const values = runs.map((r) => r[key]).filter((v) => v !== null);
    return { min: Math.min(...values), max: Math.max(...values), median: values.sort((a, b) => a - b)[Math.floor(values.length / 2)] };
  };
  report.firstRender = { runs, firstContentfulPaintMs: stat("firstContentfulPaintMs"), threadsShownMs: stat("threadsShownMs") };
}

// ------------------------------------------------------------------ the flow

async function main() {
  if (!TOKEN) {
    report.failures.push("SB_TOKEN is required");
    return 2;
  }
  let browser;
  try {
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, timeout: WAIT });
  } catch (error) {
    report.failures.push(`cannot start ${CHROMIUM}: ${error.message}`);
    return 2;
  }
  report.facts.browser = browser.version();
  try {
    await flow(browser);
  } catch (error) {
    if (!(error instanceof Critical)) throw error;
  } finally {
    await browser.close();
  }
  report.ok = report.failures.length === 0;
  return report.ok ? 0 : 1;
}

async function flow(browser) {
  await step("first render is timed over several page loads", () => measureFirstRender(browser));
  if (process.env.SB_ONLY_RENDER === "1") return;

  const { context, page } = await newPage(browser, DESKTOP);
  const net = watch(page);
  // Unique bytes per run, so the first upload is never a duplicate of an earlier run's.
  const pdf = pdfWithText(`Switchboard quarterly numbers 4217 (run ${Date.now()})`);
  const png = noisyPng(800, 600, Date.now());
  const pdfFile = { name: "report.pdf", mimeType: "application/pdf", buffer: pdf };
  const pngFile = { name: "chart.png", mimeType: "image/png", buffer: png };
  let mainThread = null;
  const transcript = () =>
    page.$$eval(".messages .msg-user, .messages .msg-assistant", (els) =>
      els.map((e) => ({
        role: e.classList.contains("msg-user") ? "user" : "assistant",
        text: e.querySelector(".msg-text")?.textContent ?? "",
        files: [...e.querySelectorAll(".chip-name")].map((c) => c.textContent),
      })),
    );

  await step("a pasted token signs in; a wrong one is refused with a message", async () => {
    await page.goto(`${ORIGIN}/`);
    await page.waitForSelector("html[data-ready] #token");
    await shot(page, "desktop-signin");
    await page.fill("#token", "not-a-token");
    await page.click("button:has-text('Sign in')");
    const alert = await page.waitForSelector(".signin-card [role=alert]");
    expect(/refused/.test(await alert.textContent()), `no refusal message: ${await alert.textContent()}`);
    await page.fill("#token", TOKEN);
    await page.click("button:has-text('Sign in')");
    await page.waitForSelector(".thread-list");
    expect((await page.evaluate(() => sessionStorage.getItem("sb.token"))) === TOKEN, "the token is kept in sessionStorage");
    await page.click("button.signout");
    await page.waitForSelector("#token");
    expect((await page.evaluate(() => sessionStorage.getItem("sb.token"))) === null, "sign out forgets the token");
  });

  await step("the sign-in link's fragment signs in and leaves the address and persistent storage clean", async () => {
    await page.goto(`${ORIGIN}/#token=${TOKEN}`);
    await page.waitForSelector("html[data-ready] .thread-list");
    expect(!page.url().includes("token"), `the token stayed in the address: ${page.url()}`);
    const stored = await page.evaluate(() => ({ local: localStorage.length, cookies: document.cookie, session: sessionStorage.getItem("sb.token") }));
    expect(stored.local === 0 && stored.cookies === "", `the token leaked into persistent storage: ${JSON.stringify(stored)}`);
    expect(stored.session === TOKEN, "the token is in the tab's session");
  }, { critical: true });

  await step("keyboard: skip link, labelled controls, landmarks", async () => {
    await page.keyboard.press("Tab");
    expect(await page.evaluate(() => document.activeElement?.classList.contains("skip")), "the first Tab reaches the skip link");
    await page.keyboard.press("Enter");
    expect(await page.evaluate(() => document.activeElement?.id === "message-text"), "the skip link moves focus to the message box");
    const unlabelled = await page.evaluate(() =>
      [...document.querySelectorAll("input, select, textarea, button")]
        .filter((el) => el.getAttribute("aria-hidden") !== "true")
        .filter((el) => {
          if (el.tagName === "BUTTON") return !(el.getAttribute("aria-label") || el.textContent.trim());
          return !(el.labels?.length || el.getAttribute("aria-label") || el.getAttribute("aria-labelledby"));
        })
        .map((el) => el.outerHTML.slice(0, 80)),
    );
    expect(unlabelled.length === 0, `controls without a label: ${unlabelled.join(" | ")}`);
    const landmarks = await page.evaluate(() => ["header", "nav[aria-label]", "main"].map((s) => !!document.querySelector(s)));
    expect(landmarks.every(Boolean), `landmarks missing: ${landmarks}`);
  });

  await step("a message gets its reply streamed token by token", async () => {
    await page.click("button.new-thread");
    mainThread = await page.evaluate(() => sessionStorage.getItem("sb.thread"));
    const text = `/slow ${words("t", 12)}`;
    let midway = false;
    const texts = await recordStream(page, async () => {
      await page.focus("#message-text");
      await page.keyboard.type(text);
      await page.keyboard.press("Enter");
      await page.waitForFunction(() => /t5/.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
      const status = await page.getAttribute(".run-status", "data-status");
      midway = status === "streaming";
      await shot(page, "desktop-streaming");
      await replyIs(page, `You said: ${text}`);
    });
    const growing = texts.filter((t) => t.startsWith("You said:"));
    expect(midway, "the status said the agent was replying while it streamed");
    expect(growing.length >= 6, `the reply grew in ${growing.length} steps: ${JSON.stringify(texts)}`);
    expect(growing.every((t, i) => i === 0 || t.startsWith(growing[i - 1])), "each step extends the previous text");
    expect(net.runs.at(-1)?.messages?.length === 1, "HttpAgent sent only the new turn");
    report.facts.streamSteps = growing.length;
  });

  await step("a tool call is shown as a step with its arguments, result and card", async () => {
    await send(page, '/tool lookup {"city": "Hanoi"}');
    await replyIs(page, "lookup finished.");
    const stepEl = await page.waitForSelector('.step[data-step="lookup"].step-done');
    await stepEl.click({ position: { x: 30, y: 12 } });
    const detail = await stepEl.textContent();
    expect(detail.includes('"city": "Hanoi"'), `the step shows its arguments: ${detail}`);
    expect(detail.includes('"ok": true'), `the step shows its result: ${detail}`);
    expect((await stepEl.$$(".ui-card")).length === 1, "the tool result carries its card");
    expect((await assistantTexts(page)).includes("Calling lookup."), "the calling message is shown");
  });

  await step("a uiSchema card is rendered as UiSchemaRenderer 2.0 describes", async () => {
    await send(page, "/ui Weekly report");
    await replyIs(page, "You said: /ui Weekly report");
    const card = page.locator(".msg-assistant").last().locator(".ui-card");
    await card.waitFor();
    expect((await card.getAttribute("data-ui-version")) === "2.0", "version 2.0");
    expect((await card.locator("h3.ui-title").textContent()) === "Weekly report", "the title text");
    expect((await card.locator(".ui-badge").textContent()) === "SUCCESS", "the status badge");
    expect((await card.locator(".ui-badge").getAttribute("class")).includes("ui-badge-success"), "the badge's status");
    expect((await card.locator(".ui-body").textContent()) === "You said: /ui Weekly report", "the body text");
    expect((await card.getAttribute("class")).includes("ui-status-success"), "the card's status");
  });

  await step("a file the agent made is shown as a files block whose link works", async () => {
    await send(page, "/file notes.md Minutes of the weekly meeting");
    await replyIs(page, "Here is notes.md.");
    const chip = page.locator(".msg-assistant").last().locator(".files-block .chip");
    expect((await chip.locator(".chip-name").textContent()) === "notes.md", "the chip names the file");
    const [answer] = await Promise.all([
      page.waitForResponse((r) => r.url().includes("/v2/files/download-url")),
      context.waitForEvent("page").then((popup) => popup.close()),
      chip.click(),
    ]);
    const { url } = await answer.json();
    const body = await context.request.get(url);
    expect(body.status() === 200, `the fresh link answers ${body.status()}`);
    expect((await body.text()) === "Minutes of the weekly meeting", "the link serves the agent's file");
    await shot(page, "desktop-conversation");
  });

  await step("type, size and count errors are told clearly", async () => {
    await page.setInputFiles("#file-input", [{ name: "setup.exe", mimeType: "application/x-msdownload", buffer: Buffer.from("MZ") }]);
    let errors = await page.textContent(".composer-errors");
    expect(/setup\.exe: this type of file is not supported/.test(errors), `type error: ${errors}`);
    // 100 MB and one byte, as a sparse file: the page must refuse it before reading it.
    const huge = join(tmpdir(), `sb-e2e-huge-${process.pid}.txt`);
    const fd = openSync(huge, "w");
    ftruncateSync(fd, 100 * 1024 * 1024 + 1);
    closeSync(fd);
    try {
      await page.setInputFiles("#file-input", huge);
    } finally {
      unlinkSync(huge);
    }
    errors = await page.textContent(".composer-errors");
    expect(/sb-e2e-huge-\d+\.txt: 100\.0 MB is over the 100 MB limit per file/.test(errors), `size error: ${errors}`);
    const small = (n) => ({ name: `note-${n}.txt`, mimeType: "text/plain", buffer: Buffer.from(`note ${n} ${Date.now()}`) });
    await page.setInputFiles("#file-input", [small(1), small(2), small(3), small(4)]);
    errors = await page.textContent(".composer-errors");
    expect(/note-4\.txt: at most 3 files can be sent with one message/.test(errors), `count error: ${errors}`);
    expect((await page.$$(".draft")).length === 3, "three files were kept");
    expect((await page.$$(".composer-errors[role=alert]")).length === 1, "the errors are announced");
    // The kept files upload at once: let them finish, so that their POSTs to S3 are not counted
    // as the next check's.
    await page.waitForFunction(() => document.querySelectorAll(".draft.draft-done, .draft.draft-error").length === 3, null, { timeout: 30_000 });
    for (let i = 0; i < 3; i++) await page.click(".draft button[aria-label^='Remove']");
    await page.waitForFunction(() => document.querySelectorAll(".draft").length === 0);
  });

  let pdfContentUrl = null;
  await step("a PDF and an image upload (SHA-256 in the page, presigned POST with progress) and are read by the agent", async () => {
    const s3Before = net.s3Posts.length;
    // The PDF goes to our S3 server as it is: it sends no CORS headers, so the client posts
    // the form as the seed does (no-cors), shows an indeterminate bar and lets the service
    // confirm the stored bytes.
    await page.evaluate(() => {
      window.__phases = {};
      window.__phaseObserver = new MutationObserver(() => {
        for (const li of document.querySelectorAll(".draft")) {
          const name = li.getAttribute("data-file");
          const list = (window.__phases[name] ??= []);
          const bar = li.querySelector("progress");
          const text = (bar ? (bar.hasAttribute("value") ? `bar:${bar.value}` : "bar:indeterminate") + " " : "") + li.querySelector(".draft-status").textContent;
          if (list.at(-1) !== text) list.push(text);
        }
      });
      window.__phaseObserver.observe(document.querySelector(".composer"), { subtree: true, childList: true, characterData: true, attributes: true });
    });
    await page.setInputFiles("#file-input", [pdfFile]);
    await page.waitForSelector('.draft[data-file="report.pdf"].draft-done', { timeout: 30_000 });
    const pdfPosts = net.s3Posts.slice(s3Before);
    // The image goes through the bucket's CORS rule (deploy/k8s/infra/s3/cors.json), which our
    // S3 server cannot hold: with the S3 origin routed, Playwright answers the browser's CORS
    // preflight (as that rule would), and the form itself goes to S3 on the real network,
    // slowed to 1 MB/s so the XMLHttpRequest's upload events move the bar.
    await context.route(`${S3_URL}/**`, (route) => route.continue());
    const cdp = await context.newCDPSession(page);
    await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: 1024 * 1024 });
    await page.setInputFiles("#file-input", [pngFile]);
    await page.waitForFunction(() => (document.querySelector('.draft[data-file="chart.png"] progress')?.value ?? 0) >= 0.3);
    await shot(page, "desktop-upload");
    await page.waitForSelector('.draft[data-file="chart.png"].draft-done', { timeout: 30_000 });
    await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
    await context.unroute(`${S3_URL}/**`);
    const phases = await page.evaluate(() => {
      window.__phaseObserver.disconnect();
      return window.__phases;
    });
    report.facts.uploadPhases = phases;
    expect(phases["report.pdf"].some((p) => p.startsWith("bar:indeterminate")), `the PDF showed a bar: ${phases["report.pdf"]}`);
    expect(phases["report.pdf"].at(-1) === "Uploaded", `the PDF ended uploaded: ${phases["report.pdf"]}`);
    const percents = phases["chart.png"].map((p) => /^bar:([\d.]+)/.exec(p)?.[1]).filter(Boolean).map(Number);
    expect(percents.filter((v) => v > 0 && v < 1).length >= 3, `the image's bar moved in steps: ${phases["chart.png"]}`);
    expect(percents.every((v, i) => i === 0 || v >= percents[i - 1]), "the bar only moves forward");
    expect(percents.at(-1) === 1, `the bar reached 100%: ${phases["chart.png"]}`);
    expect(phases["chart.png"].at(-1) === "Uploaded", `the image ended uploaded: ${phases["chart.png"]}`);
    const forms = net.uploadUrl.slice(-2);
    expect(forms[0].body.content_hash === sha256(pdf) && forms[1].body.content_hash === sha256(png), "the page computed each file's SHA-256");
    expect(forms.every((f) => f.answer?.upload_required === true && f.answer?.is_duplicate === false), `both needed an upload: ${JSON.stringify(forms)}`);
    pdfContentUrl = forms[0].answer.content_url;
    const pngPosts = net.s3Posts.slice(s3Before + pdfPosts.length);
    report.facts.s3Posts = { pdf: pdfPosts, png: pngPosts };
    // The PDF: the XMLHttpRequest stopped at the refused preflight, then the seed's no-cors
    // POST, which S3 answered 2xx (seen by the network layer; the page cannot read it).
    expect(pdfPosts.filter((p) => p.status >= 200 && p.status < 300).length === 1, `S3 took the PDF once: ${JSON.stringify(pdfPosts)}`);
    // The image: one POST; its answer carries no CORS header, so the browser hides it and the
    // service confirmed the stored bytes ("Checking the upload…" above; the bytes are
    // compared again when the file is opened from history).
    expect(pngPosts.length === 1, `one POST sent the image: ${JSON.stringify(pngPosts)}`);
    expect(phases["chart.png"].includes("Checking the upload…"), "the service confirmed the image");
    await send(page, "Please read these");
    const texts = await page.waitForFunction(() => {
      const last = [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? "";
      const idle = document.querySelector(".run-status")?.getAttribute("data-status") === "idle";
      return idle && last.startsWith("You said: Please read these") && last;
    });
    const reply = await texts.jsonValue();
    expect(reply.includes("Attachment report.pdf (application/pdf):") && reply.includes("Switchboard quarterly numbers 4217"), `the agent read the PDF: ${reply}`);
    expect(new RegExp(`Attachment chart\\.png \\(image/png\\): image, ${png.length} bytes`).test(reply), `the agent got the image: ${reply}`);
    const chips = await page.locator(".msg-user").last().locator(".chip-name").allTextContents();
    expect(chips.join(",") === "report.pdf,chart.png", `the message shows its file chips: ${chips}`);
  });

  await step("the same file again is answered as a duplicate and not uploaded", async () => {
    const s3Before = net.s3Posts.length;
    const formsBefore = net.uploadUrl.length;
    await page.setInputFiles("#file-input", [pdfFile]);
    const done = await page.waitForSelector('.draft[data-file="report.pdf"].draft-done');
    expect((await done.textContent()).includes("Already uploaded: no upload needed"), "the chip says no upload was needed");
    const form = net.uploadUrl[formsBefore];
    expect(form?.answer?.is_duplicate === true && form.answer.upload_required === false, `upload-url answered a duplicate: ${JSON.stringify(form)}`);
    expect(form.answer.content_url === pdfContentUrl, "the same content_url as the first upload");
    expect(net.s3Posts.length === s3Before, "nothing was posted to S3");
    await send(page, "And this one again");
    await page.waitForFunction(() => {
      const last = [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? "";
      return document.querySelector(".run-status")?.getAttribute("data-status") === "idle" && last.startsWith("You said: And this one again") && last.includes("report.pdf");
    });
  });

  await step("a user's file chip opens a fresh download link", async () => {
    const chip = page.locator(".msg-user .chip", { hasText: "report.pdf" }).first();
    const [answer] = await Promise.all([
      page.waitForResponse((r) => r.url().includes("/v2/files/download-url")),
      context.waitForEvent("page").then((popup) => popup.close()),
      chip.click(),
    ]);
    const { url } = await answer.json();
    expect(url.startsWith(`${ORIGIN}/v2/files/content/`), `the link points at the gateway: ${url}`);
    const body = await context.request.get(url);
    expect(body.status() === 200 && sha256(await body.body()) === sha256(pdf), "the link serves the uploaded PDF");
  });

  const prompts = [
    { type: "text", question: "What is your name?", answer: async (card) => {
        await card.locator("input[type=text]").fill("Ada");
        await card.locator("input[type=text]").press("Enter");
      }, reply: "You answered: Ada", label: "Ada" },
    { type: "binary_choice", question: "Continue with the import?", answer: (card) => card.locator("button", { hasText: "Continue" }).click(), reply: "You answered: continue", label: "Continue" },
    { type: "radio", question: "Pick a channel", answer: async (card) => {
        // Keyboard only: focus lands on the first option; arrows choose, Tab reaches Answer.
        await card.page().keyboard.press("ArrowDown");
        await card.page().keyboard.press("Tab");
        await card.page().keyboard.press("Enter");
      }, reply: "You answered: sms", label: "SMS", shot: "desktop-prompt" },
    { type: "checkbox", question: "Which channels?", answer: async (card) => {
        await card.locator("label", { hasText: "Email" }).click();
        await card.locator("label", { hasText: "Push Notification" }).click();
        await card.locator("button[type=submit]").click();
      }, reply: 'You answered: ["email","push"]', label: "Email, Push Notification" },
    { type: "dropdown", question: "Preferred channel?", answer: async (card) => {
        await card.locator("select").selectOption("push");
        await card.locator("button[type=submit]").click();
      }, reply: "You answered: push", label: "Push Notification" },
  ];
  for (const prompt of prompts) {
    await step(`a ${prompt.type} prompt counts down and its answer continues the run`, async () => {
      await send(page, `/ask ${prompt.type}:120 ${prompt.question}`);
      const card = page.locator(`form.prompt[data-input-type="${prompt.type}"]`).last();
      await card.waitFor();
      expect((await card.locator(".prompt-question").textContent()) === prompt.question, "the question is shown");
      const timer = card.locator(".prompt-timer strong");
      const first = await timer.textContent();
      expect(/^(2:00|1:[0-5]\d)$/.test(first), `the time left starts near 2:00: ${first}`);
      await page.waitForFunction(([el, start]) => el.textContent !== start, [await timer.elementHandle(), first], { timeout: 5000 });
      const focused = await page.evaluate(() => !!document.activeElement?.closest("form.prompt"));
      expect(focused, "focus moved to the question");
      // While the question is open a new message cannot be sent.
      await page.fill("#message-text", "something else");
      expect(await page.isDisabled("button.send"), "Send is disabled while the question is open");
      expect((await page.textContent(".composer-hint")) === "Answer or dismiss the agent's question first.", "the message box says why");
      await page.fill("#message-text", "");
      await card.locator("input, select, button").first().focus();
      if (prompt.shot) await shot(page, prompt.shot);
      await prompt.answer(card);
      await replyIs(page, prompt.reply);
      expect((await card.locator(".prompt-state").textContent()) === `You answered: ${prompt.label}`, "the card shows the answer");
      const resumed = net.runs.at(-1);
      expect(resumed?.resume?.[0]?.status === "resolved" && resumed.messages.length === 0, "the answer went as AG-UI resume");
    });
  }

  await step("a prompt that times out shows its error and the run continues", async () => {
    await send(page, "/ask dropdown:3 Last call?");
    const card = page.locator('form.prompt[data-input-type="dropdown"]').last();
    await card.locator(".prompt-timer").waitFor();
    const expired = card.locator(".prompt-expired");
    await expired.waitFor({ timeout: 15_000 });
    expect((await expired.textContent()) === "This prompt is no longer available.", `the prompt's error: ${await expired.textContent()}`);
    expect(await card.locator("select").isDisabled(), "the expired prompt can no longer be answered");
    await replyIs(page, "No answer came in time to: Last call?");
    const timeoutRun = net.resumes.at(-1);
    expect(timeoutRun?.run.endsWith("-prompt-timeout"), `the client followed the continuation run: ${JSON.stringify(timeoutRun)}`);
    await shot(page, "desktop-timeout");
  });

  await step("stop cancels a run mid-reply", async () => {
    const text = `/slow ${words("c", 40)}`;
    await send(page, text);
    await page.waitForFunction(() => / c3 /.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
    await page.click("button.stop");
    const notice = page.locator(".msg-notice").last();
    await notice.waitFor();
    await page.waitForFunction(() => document.querySelector(".run-status")?.getAttribute("data-status") === "idle");
    expect(/^Stopped/.test(await notice.textContent()), `the notice says stopped: ${await notice.textContent()}`);
    const shown = await lastAssistant(page);
    const full = `You said: ${text}`;
    expect(full.startsWith(shown) && shown.length < full.length, `the reply stopped part-way: ${shown}`);
    const runId = await page.locator(".msg-assistant").last().getAttribute("data-run");
    const status = await page.evaluate(async (id) => {
      const r = await fetch(`/api/v1/agent/runs/${id}`, { headers: { Authorization: `Bearer ${sessionStorage.getItem("sb.token")}` } });
      return (await r.json()).status;
    }, runId);
    expect(status === "cancelled", `the run's status is ${status}`);
  });

  await step("a network drop mid-reply is resumed from the last event", async () => {
    const text = `/slow ${words("d", 25)}`;
    await send(page, text);
    await page.waitForFunction(() => / d3 /.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
    const before = net.resumes.length;
    await context.setOffline(true);
    report.facts.killedGatewayWorkers = dropGatewayConnections();
    await page.waitForSelector('.run-status[data-status="reconnecting"]');
    const partial = await lastAssistant(page);
    await shot(page, "desktop-reconnecting");
    await context.setOffline(false);
    await replyIs(page, `You said: ${text}`);
    const resume = net.resumes.slice(before)[0];
    expect(resume && Number(resume.lastEventId) > 2, `the client resumed with Last-Event-ID: ${JSON.stringify(resume)}`);
    expect((`You said: ${text}`).startsWith(partial), "what was shown before the drop is kept");
    report.facts.dropResume = { lastEventId: resume.lastEventId, shownBeforeDrop: partial.length };
  });

  await step("a reload mid-reply shows what came and resumes after the last event", async () => {
    const text = `/slow ${words("r", 25)}`;
    const full = `You said: ${text}`;
    await send(page, text);
    await page.waitForFunction(() => / r3 /.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
    const before = net.resumes.length;
    await page.reload();
    await page.waitForSelector("html[data-ready]");
    const restored = await lastAssistant(page);
    expect(restored && restored.length > "You said: ".length && full.startsWith(restored), `the partial reply is back after the reload: ${restored}`);
    await replyIs(page, full);
    const resume = net.resumes.slice(before)[0];
    expect(resume && Number(resume.lastEventId) > 2, `the reload resumed with Last-Event-ID: ${JSON.stringify(resume)}`);
    const texts = await assistantTexts(page);
    expect(texts.filter((t) => t === full).length === 1, "the reply is shown once");
    report.facts.reloadResume = { lastEventId: resume.lastEventId, restoredChars: restored.length };
  });

  // ------------------------------------------------------------ a second tab on the same conversation
  // Same user, its own browser context (its own sessionStorage, as another tab or device has):
  // it follows the conversation's thread stream.
  const second = await newPage(browser, DESKTOP);
  const p2 = second.page;
  const threadStreams = [];
  p2.on("request", (request) => {
    const path = new URL(request.url()).pathname;
    if (/^\/api\/v1\/agent\/threads\/[^/]+\/events$/.test(path)) threadStreams.push({ path, lastEventId: request.headers()["last-event-id"] ?? null });
  });
  const userTexts = (p) => p.$$eval(".msg-user .msg-text", (els) => els.map((e) => e.textContent));
  const status = (p) => p.getAttribute(".run-status", "data-status");

  await step("a second tab on the conversation shows a run started in the first as it streams, and neither shows it twice", async () => {
    await p2.goto(`${ORIGIN}/#token=${TOKEN}`);
    await p2.waitForSelector("html[data-ready] .thread-list");
    const streamPath = `/api/v1/agent/threads/${encodeURIComponent(mainThread)}/events`;
    await Promise.all([
      p2.waitForResponse((r) => new URL(r.url()).pathname === streamPath && r.status() === 200),
      p2.click(`.thread[data-thread="${mainThread}"]`),
    ]);
    // The conversation so far, from history: the first tab's last reply.
    const before = await lastAssistant(page);
    await p2.waitForFunction((want) => [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent === want, before);
    const text = `/slow ${words("s", 16)}`;
    const full = `You said: ${text}`;
    let partial = null;
    const texts = await recordStream(p2, async () => {
      await send(page, text);
      // The question, then the reply growing, while the first tab's run still streams.
      await p2.waitForFunction((want) => [...document.querySelectorAll(".msg-user .msg-text")].at(-1)?.textContent === want, text);
      await p2.waitForFunction(() => / s5 /.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
      partial = await lastAssistant(p2);
      const first = await lastAssistant(page);
      expect((await status(page)) === "streaming" && first.length < full.length, `the first tab's run was still streaming: ${first}`);
      expect((await status(p2)) === "streaming", `the second tab says the agent is replying: ${await status(p2)}`);
      await shot(p2, "desktop-second-tab");
      await replyIs(page, full);
      await replyIs(p2, full);
    });
    expect(full.startsWith(partial) && partial.length < full.length, `the second tab showed part of the reply first: ${partial}`);
    const growing = texts.filter((t) => full.startsWith(t) && t.length > "You said: /slow ".length);
    expect(growing.length >= 4, `the reply grew in ${growing.length} steps in the second tab: ${JSON.stringify(texts)}`);
    expect(growing.every((t, i) => i === 0 || t.startsWith(growing[i - 1])), "each step extends the previous text");
    for (const [name, p] of [["first", page], ["second", p2]]) {
      expect((await userTexts(p)).filter((t) => t === text).length === 1, `the question is shown once in the ${name} tab`);
      expect((await assistantTexts(p)).filter((t) => t === full).length === 1, `the reply is shown once in the ${name} tab`);
    }
    report.facts.secondTab = { streamSteps: growing.length, shownWhileStreaming: partial.length };
  });

  await step("the second tab's thread stream resumes after a drop with Last-Event-ID, nothing twice", async () => {
    const text = `/slow ${words("x", 16)}`;
    const full = `You said: ${text}`;
    await send(page, text);
    await p2.waitForFunction(() => / x3 /.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
    const before = threadStreams.length;
    await second.context.setOffline(true);
    dropGatewayConnections();
    await p2.waitForSelector('.run-status[data-status="reconnecting"]');
    const partial = await lastAssistant(p2);
    await second.context.setOffline(false);
    await replyIs(p2, full);
    await replyIs(page, full);
    const resume = threadStreams.slice(before)[0];
    const cursor = /^[0-9a-f-]{36}:(\d+)$/.exec(resume?.lastEventId ?? "");
    expect(cursor && Number(cursor[1]) > 2, `the thread stream resumed after an event it had: ${JSON.stringify(resume)}`);
    expect(full.startsWith(partial), `what was shown before the drop is kept: ${partial}`);
    for (const [name, p] of [["first", page], ["second", p2]]) {
      expect((await userTexts(p)).filter((t) => t === text).length === 1, `the question is shown once in the ${name} tab`);
      expect((await assistantTexts(p)).filter((t) => t === full).length === 1, `the reply is shown once in the ${name} tab`);
    }
    report.facts.threadResume = { lastEventId: resume.lastEventId, shownBeforeDrop: partial.length };
  });

  await step("a question asked in one tab is shown in the other, which can answer it", async () => {
    const question = "Ship it from the other tab?";
    await send(page, `/ask binary_choice:120 ${question}`);
    const card = page.locator('form.prompt[data-input-type="binary_choice"]').last();
    const card2 = p2.locator('form.prompt[data-input-type="binary_choice"]').last();
    await card.waitFor();
    await card2.waitFor();
    expect((await card2.locator(".prompt-question").textContent()) === question, "the second tab shows the question");
    await p2.waitForFunction(() => document.querySelector(".run-status")?.getAttribute("data-status") === "idle");
    await card2.locator("button", { hasText: "Continue" }).click();
    await replyIs(p2, "You answered: continue");
    await replyIs(page, "You answered: continue");
    expect((await card2.locator(".prompt-state").textContent()) === "You answered: Continue", "the answering tab shows the answer");
    const elsewhere = await card.locator(".prompt-state").textContent();
    expect(elsewhere === "Answered in another tab or on another device.", `the asking tab's card says it was answered elsewhere: ${elsewhere}`);
    await page.fill("#message-text", "ready");
    expect(!(await page.isDisabled("button.send")) && (await page.locator(".composer-hint").count()) === 0, "the asking tab can send again");
    await page.fill("#message-text", "");
    for (const [name, p] of [["first", page], ["second", p2]]) {
      expect((await assistantTexts(p)).filter((t) => t === "You answered: continue").length >= 1, `the reply is shown in the ${name} tab`);
      expect((await p.locator("form.prompt .prompt-question", { hasText: question }).count()) === 1, `the question is shown once in the ${name} tab`);
    }
  });
  await second.context.close();

  await step("history after a reload shows the same conversation with working file links", async () => {
    const shownBefore = await transcript();
    await page.reload();
    await page.waitForSelector("html[data-ready]");
    await page.waitForFunction((n) => document.querySelectorAll(".messages .msg-user, .messages .msg-assistant").length >= n, shownBefore.length);
    const shownAfter = await transcript();
    report.facts.transcriptLength = shownAfter.length;
    const diff = shownBefore.findIndex((m, i) => JSON.stringify(m) !== JSON.stringify(shownAfter[i]));
    expect(diff === -1 && shownBefore.length === shownAfter.length, `history differs at ${diff}: ${JSON.stringify(shownBefore[diff])} vs ${JSON.stringify(shownAfter[diff])}`);
    expect((await page.$$(".ui-card")).length >= 3, "the cards are back");
    expect((await page.$$(".step")).length >= 1, "the tool step is back");
    for (const [name, bytes] of [["report.pdf", pdf], ["chart.png", png], ["notes.md", Buffer.from("Minutes of the weekly meeting")]]) {
      const chip = page.locator(".chip", { hasText: name }).first();
      const [answer] = await Promise.all([
        page.waitForResponse((r) => r.url().includes("/v2/files/download-url")),
        context.waitForEvent("page").then((popup) => popup.close()),
        chip.click(),
      ]);
      const { url } = await answer.json();
      const body = await context.request.get(url);
      expect(body.status() === 200 && sha256(await body.body()) === sha256(bytes), `${name} opens from history`);
    }
    await shot(page, "desktop-history");
  });

  await step("the thread list is most recent first and pages; a new thread starts empty", async () => {
    const first = await page.getAttribute(".thread-list li:first-child .thread", "data-thread");
    expect(first === mainThread, `the thread just used is listed first: ${first} vs ${mainThread}`);
    await page.click("button.new-thread");
    expect((await page.$$(".messages .msg")).length === 0, "a new thread has no messages");
    await page.waitForSelector(".empty");
    if (DAYS_THREAD) {
      const listed = () => page.$$eval(".thread[data-thread]", (els) => els.map((e) => e.getAttribute("data-thread")));
      expect(!(await listed()).includes(DAYS_THREAD), "the old thread is not on the first page");
      expect((await listed()).length === 20, `a page holds 20 threads: ${(await listed()).length}`);
      while (!(await listed()).includes(DAYS_THREAD)) {
        const more = page.locator("button.more");
        expect(await more.isVisible(), "a next page is offered");
        const count = (await listed()).length;
        await more.click();
        await page.waitForFunction((n) => document.querySelectorAll(".thread[data-thread]").length > n, count);
      }
    }
  });

  if (DAYS_THREAD) {
    await step("a conversation loads day by day backwards", async () => {
      await page.click(`.thread[data-thread="${DAYS_THREAD}"]`);
      const days = () => page.$$eval(".day-label", (els) => els.map((e) => e.textContent));
      await page.waitForSelector("button.earlier");
      expect((await days()).length === 1, `the latest day first: ${await days()}`);
      const texts = [];
      while (await page.locator("button.earlier").isVisible()) {
        const n = (await days()).length;
        await page.click("button.earlier");
        await page.waitForFunction((k) => document.querySelectorAll(".day-label").length > k, n);
        texts.push(await days());
      }
      const shown = await days();
      expect(shown.length === DAYS.length, `every day was loaded: ${shown}`);
      const expected = [...DAYS].reverse().map((d) => new Date(`${d}T12:00:00`).toLocaleDateString("en-US", { weekday: "long", year: "numeric", month: "long", day: "numeric" }));
      expect(JSON.stringify(shown) === JSON.stringify(expected), `oldest day on top: ${shown} vs ${expected}`);
      await shot(page, "desktop-days");
    });
  }

  // ------------------------------------------------------------ managing conversations
  // Two new conversations with words no other has (this run's tag): a search finds one, which is
  // renamed; the other is deleted after its confirmation.
  const tag = Date.now().toString(36);
  const wordA = `kestrel${tag}`;
  const wordB = `quokka${tag}`;
  // Markup and entities in the text: the snippet (HTML-escaped by the server) must show them as text.
  const textA = `${wordA} notes: <i>draft</i> & "final" plans`;
  const textB = `${wordB} shopping list for the weekend`;
  const renamed = `Plans (${tag})`;
  let threadA = null;
  let threadB = null;
  const searchBox = page.getByRole("searchbox", { name: "Search conversations" });
  const rowOf = (id) => page.locator(`.thread-list li[data-thread-row="${id}"]`);
  const titleIs = (id, want) =>
    page.waitForFunction(([id, want]) => document.querySelector(`.thread[data-thread="${id}"] .thread-title`)?.textContent === want, [id, want]);
  /** The answer to the search of exactly `q`. */
  const searchAnswer = (q) =>
    page.waitForResponse((r) => {
      const url = new URL(r.url());
      return url.pathname === "/api/v1/agent/threads" && url.searchParams.get("q") === q;
    });
  /** Whether a request is `method` on the thread `id` (rename, delete). */
  const threadCall = (method, id) => (request) => request.method() === method && new URL(request.url()).pathname === `/api/v1/agent/threads/${encodeURIComponent(id)}`;
  const threadAnswer = (method, id) => page.waitForResponse((response) => threadCall(method, id)(response.request()));
  const newConversation = async (text) => {
    await page.click("button.new-thread");
    const id = await page.evaluate(() => sessionStorage.getItem("sb.thread"));
    await send(page, text);
    await replyIs(page, `You said: ${text}`);
    await page.waitForSelector(`.thread[data-thread="${id}"]`);
    return id;
  };

  await step("two new conversations are listed with their first message as their title", async () => {
    threadA = await newConversation(textA);
    threadB = await newConversation(textB);
    await titleIs(threadA, textA);
    await titleIs(threadB, textB);
  });

  await step("a search lists only the conversation with the word, the match highlighted, and opens it at that message", async () => {
    expect(threadA && threadB, "the two conversations exist");
    const searches = [];
    const onRequest = (request) => {
      const url = new URL(request.url());
      if (url.pathname === "/api/v1/agent/threads" && url.searchParams.has("q")) searches.push(url.searchParams.get("q"));
    };
    page.on("request", onRequest);
    try {
      const answered = searchAnswer(wordA);
      await searchBox.click();
      await page.keyboard.type(wordA);
      const answer = await answered;
      expect(answer.status() === 200, `the search answered ${answer.status()}`);
      const body = await answer.json();
      // The results of the whole word (not of a part typed before): the search is over.
      await page.waitForSelector(`.search-results:not([aria-busy]) .search-hit[data-hit="${threadA}"]`);
      const hits = await page.$$eval(".search-hit", (els) => els.map((e) => e.getAttribute("data-hit")));
      expect(hits.length === 1 && hits[0] === threadA, `only the conversation with the word is listed: ${JSON.stringify(hits)}`);
      expect((await page.locator(".thread[data-thread]").count()) === 0, "the thread list makes way for the results");
      const snippet = page.locator(`.search-hit[data-hit="${threadA}"] .hit-snippet`);
      const marks = await snippet.locator("mark").allTextContents();
      expect(marks.length >= 1 && marks.every((m) => m.toLowerCase() === wordA), `the word is highlighted: ${JSON.stringify(marks)}`);
      const shown = await snippet.textContent();
      expect(shown.includes(`${wordA} notes: <i>draft</i> & "final" plans`), `the escaped text is shown as text: ${shown} (sent ${body.threads[0]?.snippet})`);
      expect((await snippet.locator("i").count()) === 0, "no markup of the message is injected");
      expect(searches.length * 2 < wordA.length, `typing is debounced: ${searches.length} searches for ${wordA.length} keys`);
      report.facts.searchRequests = searches.length;
      await shot(page, "desktop-search");
      const messageId = body.threads[0].messageId;
      await page.click(`.search-hit[data-hit="${threadA}"]`);
      await page.waitForSelector(`.msg-found[data-key="${messageId}"]`);
      expect((await page.evaluate(() => sessionStorage.getItem("sb.thread"))) === threadA, "the hit's conversation is open");
      expect((await page.getAttribute(`.search-hit[data-hit="${threadA}"]`, "aria-current")) === "page", "the hit is marked as the open conversation");
      await searchBox.fill("");
      await page.waitForSelector(`.thread[data-thread="${threadB}"]`);
      expect((await page.locator(".search-hit").count()) === 0, "an empty box shows the thread list again");
    } finally {
      page.off("request", onRequest);
    }
  });

  await step("a conversation renamed in the list shows its new title, also after a reload", async () => {
    expect(threadA, "the conversation exists");
    const row = rowOf(threadA);
    const input = row.getByRole("textbox", { name: "New title" });
    const patches = [];
    const onRequest = (request) => threadCall("PATCH", threadA)(request) && patches.push(request.url());
    page.on("request", onRequest);
    try {
      // Escape cancels: nothing is sent, the title stays.
      await row.getByRole("button", { name: /^Rename/ }).click();
      await input.fill("Not this one");
      await input.press("Escape");
      await titleIs(threadA, textA);
      expect(patches.length === 0, "a cancelled rename sends nothing");
      // An empty title: the server's message, in place.
      await row.getByRole("button", { name: /^Rename/ }).click();
      await input.fill("   ");
      const [refused] = await Promise.all([threadAnswer("PATCH", threadA), input.press("Enter")]);
      expect(refused.status() === 400, `an empty title answered ${refused.status()}`);
      const error = row.locator(".rename [role=alert]");
      await error.waitFor();
      expect(/title must not be empty/.test(await error.textContent()), `the server's message is shown: ${await error.textContent()}`);
      expect((await input.getAttribute("aria-invalid")) === "true", "the field is marked invalid");
      // Enter saves.
      await input.fill(renamed);
      const [saved] = await Promise.all([threadAnswer("PATCH", threadA), input.press("Enter")]);
      expect(saved.status() === 200, `the rename answered ${saved.status()}: ${await saved.text()}`);
      expect((await saved.json()).title === renamed, "the answer is the renamed thread");
      await titleIs(threadA, renamed);
      expect((await page.textContent("#conversation-title")) === renamed, "the open conversation has the new title");
      await shot(page, "desktop-rename");
      await page.reload();
      await page.waitForSelector("html[data-ready] .thread-list");
      await titleIs(threadA, renamed);
    } finally {
      page.off("request", onRequest);
    }
  });

  await step("a conversation deleted after its confirmation is gone from the list, also after a reload, and left when open", async () => {
    expect(threadB, "the conversation exists");
    await page.click(`.thread[data-thread="${threadB}"]`);
    await page.waitForFunction((want) => [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent === want, `You said: ${textB}`);
    const row = rowOf(threadB);
    const dialog = row.getByRole("alertdialog");
    const deletes = [];
    const onRequest = (request) => request.method() === "DELETE" && deletes.push(request.url());
    page.on("request", onRequest);
    try {
      // Cancel: nothing is sent, the conversation stays.
      await row.getByRole("button", { name: /^Delete/ }).click();
      await dialog.waitFor();
      expect((await dialog.textContent()).includes(textB), `the confirmation names the conversation: ${await dialog.textContent()}`);
      await dialog.getByRole("button", { name: "Cancel" }).click();
      await dialog.waitFor({ state: "detached" });
      expect(deletes.length === 0, "a cancelled delete sends nothing");
      expect((await page.locator(`.thread[data-thread="${threadB}"]`).count()) === 1, "the conversation stays after Cancel");
      // Confirmed.
      await row.getByRole("button", { name: /^Delete/ }).click();
      await dialog.waitFor();
      await shot(page, "desktop-delete-confirm");
      const [answer] = await Promise.all([threadAnswer("DELETE", threadB), dialog.getByRole("button", { name: "Delete", exact: true }).click()]);
      expect(answer.status() === 204, `the delete answered ${answer.status()}: ${await answer.text()}`);
      await page.waitForSelector(`.thread[data-thread="${threadB}"]`, { state: "detached" });
      expect((await page.evaluate(() => sessionStorage.getItem("sb.thread"))) !== threadB, "the deleted conversation is no longer the open one");
      await page.waitForSelector(".empty");
      expect((await page.locator(".messages .msg").count()) === 0, "a new empty conversation takes its place");
    } finally {
      page.off("request", onRequest);
    }
    await page.reload();
    await page.waitForSelector("html[data-ready] .thread-list");
    await page.waitForSelector(`.thread[data-thread="${threadA}"]`);
    expect((await page.locator(`.thread[data-thread="${threadB}"]`).count()) === 0, "the deleted conversation is not listed after a reload");
    const history = await context.request.get(`${ORIGIN}/api/v1/agent/history/blocks?threadId=${encodeURIComponent(threadB)}`, { headers: { Authorization: `Bearer ${TOKEN}` } });
    expect(history.status() === 404, `its history answers ${history.status()}`);
    const answered = searchAnswer(wordB);
    await searchBox.fill(wordB);
    expect((await answered).status() === 200, "the search of its word answered");
    await page.waitForSelector(".search-results:not([aria-busy]) .search-status:has-text('No conversation matches')");
    expect((await page.locator(".search-hit").count()) === 0, "a search no longer finds it");
    await searchBox.fill("");
    await page.waitForSelector(`.thread[data-thread="${threadA}"]`);
  });

  await step("a search of only punctuation, or too long, shows the server's message in place", async () => {
    const errorsBefore = report.facts.pageErrors?.length ?? 0;
    const error = page.locator("#thread-search-error");
    for (const [q, want] of [
      ["?!… ,", "q must contain a letter or a digit"],
      ["a".repeat(257), "q must be at most 256 characters"],
    ]) {
      const answered = searchAnswer(q);
      await searchBox.fill(q);
      const answer = await answered;
      expect(answer.status() === 400, `${q.slice(0, 12)} answered ${answer.status()}`);
      const message = (await answer.json())?.error?.message;
      expect(message === want, `the server's message: ${message}`);
      await page.waitForFunction((want) => document.querySelector("#thread-search-error")?.textContent === want, want);
      expect((await searchBox.getAttribute("aria-invalid")) === "true", "the box is marked invalid");
      if (q.length < 10) await shot(page, "desktop-search-error");
    }
    // Escape empties the box: the list is back, the message gone.
    await searchBox.press("Escape");
    await page.waitForSelector(`.thread[data-thread="${threadA}"]`);
    expect((await searchBox.inputValue()) === "", "Escape empties the box");
    expect((await error.count()) === 0, "the message goes with the query");
    expect((report.facts.pageErrors?.length ?? 0) === errorsBefore, `the page did not crash: ${JSON.stringify(report.facts.pageErrors)}`);
  });

  // ------------------------------------------------------------ versions and branches
  // A conversation whose reply is asked again (the old one kept as a previous version), then
  // branched from the new reply into a conversation of its own; its original, once erased,
  // can no longer be branched from.
  const againText = `/slow ${words("again", 8)} ${tag}`;
  const againReply = `You said: ${againText}`;
  const auth = { headers: { Authorization: `Bearer ${TOKEN}` } };
  let threadR = null;
  let userKey = null;
  let newKey = null;
  /** The switcher on the reply `key` says `text` ("2 / 2"). */
  const versionIs = (key, text) => page.waitForSelector(`.msg-assistant[data-key="${key}"] .versions .version-count:text-is("${text}")`);
  const forkAnswer = (id) => page.waitForResponse((r) => r.request().method() === "POST" && new URL(r.url()).pathname === `/api/v1/agent/threads/${encodeURIComponent(id)}/fork`);

  await step("a reply asked again streams in place of the old one, which stays as a previous version, also after a reload", async () => {
    threadR = await newConversation(againText);
    userKey = await page.locator(".messages .msg-user").last().getAttribute("data-key");
    const oldReply = page.locator(".messages .msg-assistant").last();
    const oldKey = await oldReply.getAttribute("data-key");
    const oldRun = await oldReply.getAttribute("data-run");
    let newRun = null;
    const texts = await recordStream(page, async () => {
      const [request] = await Promise.all([
        page.waitForRequest((r) => r.method() === "POST" && r.url().endsWith("/api/v1/agent/ag-ui")),
        oldReply.getByRole("button", { name: "Regenerate this reply" }).click(),
      ]);
      // The request of a new turn, with a new run id and the same user message, without the old reply.
      const body = request.postDataJSON();
      newRun = body.runId;
      expect(newRun && newRun !== oldRun, `a new run id: ${newRun} (the old ${oldRun})`);
      const sent = body.messages ?? [];
      expect(
        sent.length === 1 && sent[0].id === userKey && sent[0].role === "user" && sent[0].content === againText && body.threadId === threadR,
        `the same user message alone: ${JSON.stringify(sent)}`,
      );
      // In its place: the new reply streams, the old one is put away, the switcher says 2 / 2.
      await page.waitForSelector(`.msg-assistant[data-run="${newRun}"][aria-busy="true"] .msg-text`);
      expect((await page.locator(`.msg[data-key="${oldKey}"]`).count()) === 0, "the old reply makes way for the new one");
      await page.waitForSelector(`.msg-assistant[data-run="${newRun}"] .version-count:text-is("2 / 2")`);
      await page.waitForFunction(() => /again4/.test([...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent ?? ""));
      await shot(page, "desktop-regenerate");
      await replyIs(page, againReply, 30_000);
    });
    const start = texts.findIndex((t) => !t.startsWith("You said:"));
    const growing = texts.slice(start + 1).filter((t) => t.startsWith("You said:"));
    expect(start >= 0 && growing.length >= 4, `the new reply grew in place: ${JSON.stringify(texts)}`);
    expect(growing.every((t, i) => i === 0 || t.startsWith(growing[i - 1])), `each step extends the previous text: ${JSON.stringify(growing)}`);
    const newReply = page.locator(".messages .msg-assistant").last();
    newKey = await newReply.getAttribute("data-key");
    expect(newKey !== oldKey && (await newReply.getAttribute("data-run")) === newRun, `a new reply: ${newKey} (the old ${oldKey})`);
    const once = async (when) => {
      expect((await page.locator(".messages .msg-user").count()) === 1, `${when}: the user message is shown once`);
      expect((await page.locator(".messages .msg-assistant").count()) === 1, `${when}: one version of the reply at a time`);
    };
    await once("asked again");
    await versionIs(newKey, "2 / 2");
    // The previous version, and back.
    await page.getByRole("button", { name: "Previous version" }).click();
    await versionIs(oldKey, "1 / 2");
    expect((await page.locator(`.msg[data-key="${newKey}"]`).count()) === 0, "the previous version takes the new one's place");
    expect((await page.textContent(`.msg[data-key="${oldKey}"] .msg-text`)) === againReply, "the previous version keeps its text");
    await once("the previous version");
    await page.getByRole("button", { name: "Next version" }).click();
    await versionIs(newKey, "2 / 2");
    // After a reload, from history: the same, the old reply marked as replaced by the new run.
    await page.reload();
    await page.waitForSelector("html[data-ready] .thread-list");
    await versionIs(newKey, "2 / 2");
    await once("after a reload");
    expect((await page.locator(`.msg[data-key="${oldKey}"]`).count()) === 0, "after a reload the previous version is put away");
    await page.getByRole("button", { name: "Previous version" }).click();
    await versionIs(oldKey, "1 / 2");
    expect((await page.getAttribute(`.msg[data-key="${oldKey}"]`, "data-superseded")) === newRun, "history marks the old reply as replaced by the new run");
    await page.getByRole("button", { name: "Next version" }).click();
    await versionIs(newKey, "2 / 2");
    const stored = await (await context.request.get(`${ORIGIN}/api/v1/agent/history/blocks?threadId=${encodeURIComponent(threadR)}`, auth)).json();
    const metadata = Object.fromEntries(stored.messages.map((m) => [m.id, m.metadata]));
    expect(stored.messages.filter((m) => m.id === userKey).length === 1, `history holds the user message once: ${stored.messages.map((m) => m.id)}`);
    expect(metadata[oldKey]?.superseded_by === newRun && metadata[newKey]?.regenerates === userKey, `history's marks: ${JSON.stringify(metadata)}`);
  });

  await step("a conversation branched from a message opens as a new conversation holding the messages up to it", async () => {
    expect(threadR && newKey, "the conversation asked again exists");
    const later = `after the branch point ${tag}`;
    await send(page, later);
    await replyIs(page, `You said: ${later}`);
    const titleR = await page.textContent(`.thread[data-thread="${threadR}"] .thread-title`);
    const branchPoint = page.locator(`.msg-assistant[data-key="${newKey}"]`);
    const [answer] = await Promise.all([forkAnswer(threadR), branchPoint.getByRole("button", { name: "Branch from here" }).click()]);
    expect(answer.status() === 201, `the fork answered ${answer.status()}: ${await answer.text()}`);
    expect(answer.request().postDataJSON()?.messageId === newKey, `the fork names the message: ${answer.request().postData()}`);
    const thread = await answer.json();
    const threadF = thread.threadId;
    expect(threadF && threadF !== threadR && thread.title === titleR && typeof thread.updatedAt === "string", `the new thread: ${JSON.stringify(thread)}`);
    // It opens, listed, holding the conversation as it stood at the message branched from (the
    // previous version of the reply left out: no switcher).
    await page.waitForFunction((id) => sessionStorage.getItem("sb.thread") === id, threadF);
    await page.waitForSelector(`.thread.current[data-thread="${threadF}"]`);
    await page.waitForSelector(`.forked-from[data-thread="${threadR}"]`);
    await page.waitForSelector(`.msg-assistant[data-key="${newKey}"]`);
    const shown = await transcript();
    expect(
      shown.length === 2 && shown[0].text === againText && shown[1].text === againReply,
      `the messages up to the branch point: ${JSON.stringify(shown)}`,
    );
    expect(
      (await page.locator(`.msg-assistant[data-key="${newKey}"] .versions`).count()) === 0,
      "the branch holds one version of the reply",
    );
    // It goes on by itself.
    const onward = `continued in the branch ${tag}`;
    await send(page, onward);
    await replyIs(page, `You said: ${onward}`);
    expect(net.runs.at(-1)?.threadId === threadF, "the branch's turn runs on the branch");
    await shot(page, "desktop-branch");
    // The original is as it was; once erased, branching from it says why, in place.
    await page.click(`.forked-from[data-thread="${threadR}"]`);
    await page.waitForFunction((want) => [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent === want, `You said: ${later}`);
    const erased = await context.request.delete(`${ORIGIN}/api/v1/agent/threads/${encodeURIComponent(threadR)}`, auth);
    expect(erased.status() === 204, `the original's delete answered ${erased.status()}`);
    const [refused] = await Promise.all([forkAnswer(threadR), branchPoint.getByRole("button", { name: "Branch from here" }).click()]);
    expect(refused.status() === 404, `a fork of an erased thread answered ${refused.status()}`);
    const message = (await refused.json())?.error?.message;
    const alert = branchPoint.locator(".fork-error[role=alert]");
    await alert.waitFor();
    expect(!!message && (await alert.textContent()).includes(message), `the server's message is shown: ${await alert.textContent()} (sent ${message})`);
    expect((await page.evaluate(() => sessionStorage.getItem("sb.thread"))) === threadR, "a refused branch leaves the conversation open");
    // After a reload the branch is listed and whole.
    await page.reload();
    await page.waitForSelector(`html[data-ready] .thread[data-thread="${threadF}"]`);
    expect((await page.locator(`.thread[data-thread="${threadR}"]`).count()) === 0, "the original is gone");
    await page.click(`.thread[data-thread="${threadF}"]`);
    await page.waitForFunction((want) => [...document.querySelectorAll(".msg-assistant .msg-text")].at(-1)?.textContent === want, `You said: ${onward}`);
    const whole = await transcript();
    expect(
      JSON.stringify(whole.map((m) => m.text)) === JSON.stringify([againText, againReply, onward, `You said: ${onward}`]),
      `the branch after a reload: ${JSON.stringify(whole)}`,
    );
  });
  await context.close();

  // ------------------------------------------------------------ phone
  const phone = await newPage(browser, PHONE, { isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
  await step("on a phone: no sideways scrolling, a drawer for the threads, prompts usable", async () => {
    const p = phone.page;
    await p.goto(`${ORIGIN}/#token=${TOKEN}`);
    await p.waitForSelector("html[data-ready]");
    expect(!(await p.isVisible(".sidebar")), "the thread list is a closed drawer");
    await p.tap("button.menu");
    await p.waitForSelector(".sidebar .thread", { state: "visible" });
    expect((await p.getAttribute("button.menu", "aria-expanded")) === "true", "the menu says it is open");
    await shot(p, "phone-threads");
    await p.tap(`.thread[data-thread="${mainThread}"]`);
    await p.waitForSelector(".ui-card");
    expect(!(await p.isVisible(".sidebar")), "choosing a thread closes the drawer");
    await p.locator(".ui-card").last().scrollIntoViewIfNeeded();
    await shot(p, "phone-conversation");
    await send(p, "/ask checkbox:120 Which channels on the phone?");
    const card = p.locator('form.prompt[data-input-type="checkbox"]').last();
    await card.waitFor();
    await shot(p, "phone-prompt");
    await card.locator("label", { hasText: "SMS" }).tap();
    await card.locator("button[type=submit]").tap();
    await replyIs(p, 'You answered: ["sms"]');
    const widths = await p.evaluate(() => ({ layout: window.innerWidth, content: document.documentElement.scrollWidth, header: document.querySelector(".topbar").scrollWidth }));
    expect(widths.layout === PHONE.width && widths.content <= PHONE.width && widths.header <= PHONE.width, `the page is wider than the phone: ${JSON.stringify(widths)}`);
    const small = await p.$$eval(".composer button, .topbar button", (els) =>
      els.filter((e) => e.offsetParent).map((e) => e.getBoundingClientRect()).filter((r) => r.height < 40 || r.width < 40).length,
    );
    expect(small === 0, `${small} buttons are smaller than 40px`);
  });
  await phone.context.close();
}

const code = await main().catch((error) => {
  report.failures.push(`driving the browser failed: ${error?.stack ?? error}`);
  return 2;
});
process.stdout.write(`${JSON.stringify(report)}\n`);
process.exitCode = code;
