// Runs tests/browser/upload.html (the seed's upload flow) in headless Chromium and checks it.
//
//   node tests/browser/driver.mjs <page-url> [timeout-ms]
//
// <page-url> carries the page's query string (base, token). Prints one JSON object on stdout
// ({ok, failures, page, s3_posts, ...}); exits 0 when every check passed, 1 when one failed,
// 2 when the browser could not be driven at all. Browser console lines go to stderr.
// Uses the system's Chromium (Debian's `chromium` package): playwright-core downloads nothing.

import { createHash } from 'node:crypto';
import { chromium } from 'playwright-core';

const CHROMIUM = process.env.SB_CHROMIUM || '/usr/bin/chromium';
const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

const [pageUrl, timeoutArg] = process.argv.slice(2);
const timeoutMs = Number(timeoutArg || 60000);

function finish(code, report) {
  process.stdout.write(`${JSON.stringify(report)}\n`);
  process.exitCode = code;
}

function check(result, s3Posts) {
  const failures = [];
  const expect = (condition, what) => {
    if (!condition) failures.push(what);
  };
  if (!result.ok) {
    failures.push(`the page's flow failed: ${result.error}`);
    return failures;
  }
  const { file, first, second } = result;
  const sha256 = createHash('sha256').update(file.text, 'utf8').digest('hex');
  expect(first.content_hash === sha256, `page SHA-256 ${first.content_hash} != ${sha256}`);
  expect(first.status === 200, `first upload-url answered ${first.status}`);
  expect(first.upload_required === true, 'first try: upload_required is true');
  expect(first.is_duplicate === false, 'first try: is_duplicate is false');
  expect(typeof first.url === 'string', 'first try: url is a string');
  expect(
    Array.isArray(first.field_names) && first.field_names.includes('key') && first.field_names.includes('policy'),
    'first try: fields carry key and policy',
  );
  expect(first.s3 && first.s3.type === 'opaque', 'first try: the S3 POST was sent (opaque no-cors response)');
  const posts = s3Posts.filter(p => p.url === first.url);
  expect(posts.length === 1, `exactly one POST to ${first.url}, saw ${posts.length}`);
  expect(
    posts.length > 0 && posts.every(p => p.status >= 200 && p.status < 300),
    `S3 answered 2xx: ${JSON.stringify(posts)}`,
  );
  expect(second.status === 200, `second upload-url answered ${second.status}`);
  expect(second.is_duplicate === true, 'second try: is_duplicate is true');
  expect(second.upload_required === false, 'second try: upload_required is false');
  expect(second.url === null && second.field_names === null, 'second try: url and fields are null');
  expect(second.s3 === null, 'second try: nothing was uploaded');
  expect(second.content_url === first.content_url, 'second try: the same content_url');
  return failures;
}

async function main() {
  if (!pageUrl) {
    finish(2, { ok: false, failures: ['usage: driver.mjs <page-url> [timeout-ms]'] });
    return;
  }
  let browser;
  try {
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS, timeout: timeoutMs });
  } catch (error) {
    finish(2, { ok: false, failures: [`cannot start ${CHROMIUM}: ${error.message}`] });
    return;
  }
  try {
    const page = await browser.newPage();
    page.on('console', message => process.stderr.write(`[page ${message.type()}] ${message.text()}\n`));
    page.on('pageerror', error => process.stderr.write(`[page error] ${error.message}\n`));
    // What S3 really answered: the page only sees an opaque response (see upload.html).
    const s3Posts = [];
    page.on('response', response => {
      const request = response.request();
      if (request.method() === 'POST' && !request.url().includes('/v2/files/')) {
        s3Posts.push({ url: request.url(), status: response.status() });
      }
    });
    page.on('requestfailed', request => {
      if (request.method() === 'POST' && !request.url().includes('/v2/files/')) {
        s3Posts.push({ url: request.url(), status: null, failure: request.failure()?.errorText });
      }
    });
    await page.goto(pageUrl, { timeout: timeoutMs });
    await page.waitForFunction(() => window.uploadFlow && window.uploadFlow.done, null, {
      timeout: timeoutMs,
    });
    const result = await page.evaluate(() => window.uploadFlow);
    const failures = check(result, s3Posts);
    finish(failures.length === 0 ? 0 : 1, {
      ok: failures.length === 0,
      failures,
      browser: browser.version(),
      page: result,
      s3_posts: s3Posts,
    });
  } catch (error) {
    finish(1, { ok: false, failures: [`driving the page failed: ${error.message}`] });
  } finally {
    await browser.close();
  }
}

await main();
