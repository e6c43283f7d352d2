// The unions of src/generated/unions.ts are what the JSON Schemas under
// schemas/ say (scripts/gen-unions.mjs; test.sh checks the same before the
// build). No asbx needed.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { render, schemasDir, outFile, stringEnum, constName } from "../scripts/gen-unions.mjs";
import { ERROR_CODES, EVENT_TYPES, LOG_LEVELS } from "../dist/index.js";

test("src/generated/unions.ts is generated from schemas/", () => {
  assert.equal(readFileSync(outFile, "utf8"), render(), "run npm run gen:unions");
});

test("the published unions hold what the schemas list", () => {
  const line = JSON.parse(readFileSync(join(schemasDir, "line.json"), "utf8"));
  assert.deepEqual([...EVENT_TYPES], line.oneOf.map((alt) => alt.properties.type.const));
  assert.deepEqual([...LOG_LEVELS], line.$defs.LogLevel.enum);
  const codes = JSON.parse(readFileSync(join(schemasDir, "error-code.json"), "utf8"));
  assert.deepEqual([...ERROR_CODES], codes.oneOf.flatMap((alt) => alt.enum ?? [alt.const]));
  assert.ok(ERROR_CODES.includes("attachment_failed"));
});

test("string enums are read from enum, const and oneOf", () => {
  assert.deepEqual(stringEnum({ type: "string", enum: ["a", "b"] }), ["a", "b"]);
  assert.deepEqual(
    stringEnum({ oneOf: [{ type: "string", enum: ["a"] }, { type: "string", const: "b", description: "x" }] }),
    ["a", "b"],
  );
  assert.equal(stringEnum({ oneOf: [{ type: "string", const: "a" }, { type: "object" }] }), undefined);
  assert.equal(stringEnum({ type: "object", properties: {} }), undefined);
  assert.equal(constName("ErrorCode"), "ERROR_CODES");
  assert.equal(constName("TerminatedBy"), "TERMINATED_BY_VALUES");
});
