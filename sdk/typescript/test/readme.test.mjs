// The README's example, run as written against a real `asbx up`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, writeFileSync, rmSync } from "node:fs";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { missing, startUp } from "./harness.mjs";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const why = missing();
if (why) console.log(`SKIP readme.test.mjs: ${why}`);
let up;
before(async () => {
  if (!why) up = await startUp();
});
after(async () => {
  await up?.stop();
});

test("the README's example runs as written", { skip: why }, async () => {
  const readme = readFileSync(join(pkg, "README.md"), "utf8");
  const block = readme.match(/## Example[\s\S]*?```js\n([\s\S]*?)```/)?.[1];
  assert.ok(block, "a js block under ## Example");
  assert.ok(block.trim().split("\n").length <= 10, "ten lines at most");
  // Inside the package, so `@asbx/sdk` resolves to it by its own name.
  const file = join(pkg, `.readme-example-${process.pid}.mjs`);
  writeFileSync(file, block);
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [file], {
      env: { ...process.env, ASBX_URL: up.url, ASBX_API_KEY: up.key },
      timeout: 60_000,
    });
    assert.match(stdout, /^tool: pick_color$/m);
    assert.match(stdout, /^Amber it is\. \| completed in \d+ ms$/m);
  } finally {
    rmSync(file, { force: true });
  }
});
