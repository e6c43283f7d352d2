/**
 * End-to-end encryption of a run with WebCrypto (docs/protocol.md §4):
 * ECDH P-256, HKDF-SHA-256 with info `"asbx-e2e-v1:" + sessionId`,
 * AES-256-GCM with additional data `sessionId.seq.type` for lines and
 * `sessionId.tool-result.callId` for a tool answer. The runner signs
 * `"asbx-e2e-v1-sig:" + sessionId + "." + serverPublicKey + "." + salt` with
 * its identity key (ECDSA P-256, SHA-256, `r || s`): a pinned key checks it.
 */

import { AsbxError } from "./errors.js";
import type { EncryptionInit } from "./types.js";

const CURVE = { name: "ECDH", namedCurve: "P-256" } as const;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

function subtle(): SubtleCrypto {
  const s = globalThis.crypto?.subtle;
  if (!s) throw new Error("WebCrypto (crypto.subtle) is not available: a secure context is needed");
  return s;
}

/** Base64url without padding. */
export function b64u(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function unb64u(s: string): Uint8Array<ArrayBuffer> {
  const bin = atob(s.replace(/-/g, "+").replace(/_/g, "/"));
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/**
 * Checks `session_init.encryption`'s signature under the pinned runner key
 * (`GET /v1/identity`), or without a pin under the `identityKey` it names
 * (which proves only that nothing altered it on the way). Throws
 * `AsbxError` `signature_invalid` when it does not verify.
 */
export async function verifySessionInit(
  init: EncryptionInit,
  sessionId: string,
  runnerPublicKey?: string,
): Promise<void> {
  const keyText = runnerPublicKey ?? init.identityKey;
  if (!keyText) return;
  const refuse = (detail: string, cause?: unknown): never => {
    throw new AsbxError({ status: 0, code: "signature_invalid", detail, cause });
  };
  if (typeof init.signature !== "string") refuse("session_init.encryption carries no signature");
  const s = subtle();
  let ok = false;
  try {
    const key = await s.importKey("raw", unb64u(keyText), { name: "ECDSA", namedCurve: "P-256" }, false, ["verify"]);
    const message = encoder.encode(`asbx-e2e-v1-sig:${sessionId}.${init.serverPublicKey}.${init.salt}`);
    ok = await s.verify({ name: "ECDSA", hash: "SHA-256" }, key, unb64u(init.signature), message);
  } catch (cause) {
    refuse("the runner key or the signature is malformed", cause);
  }
  if (!ok) {
    refuse("the session's signature does not verify: its keys were substituted on the way, or another runner signed it");
  }
}

/** `{"iv", "ciphertext"}`, both base64url. */
export interface Sealed {
  iv: string;
  ciphertext: string;
}

/** The client's ephemeral key pair; its private half never leaves it. */
export class ClientKeyPair {
  private constructor(
    private readonly pair: CryptoKeyPair,
    /** The public key as the request's `clientPublicKey`. */
    readonly publicKey: string,
  ) {}

  static async generate(): Promise<ClientKeyPair> {
    const pair = (await subtle().generateKey(CURVE, false, ["deriveBits"])) as CryptoKeyPair;
    const raw = new Uint8Array(await subtle().exportKey("raw", pair.publicKey));
    return new ClientKeyPair(pair, b64u(raw));
  }

  /**
   * The session key agreed with `session_init.encryption`, once its
   * signature verifies (under `runnerPublicKey` when pinned).
   */
  async session(init: EncryptionInit, sessionId: string, runnerPublicKey?: string): Promise<SessionCipher> {
    if (init.algorithm !== "ECDH-P256+HKDF-SHA256+AES-256-GCM") {
      throw new AsbxError({ status: 0, code: "protocol_error", detail: `unknown algorithm ${init.algorithm}` });
    }
    await verifySessionInit(init, sessionId, runnerPublicKey);
    const s = subtle();
    const server = await s.importKey("raw", unb64u(init.serverPublicKey), CURVE, false, []);
    const secret = await s.deriveBits({ name: "ECDH", public: server }, this.pair.privateKey, 256);
    const ikm = await s.importKey("raw", secret, "HKDF", false, ["deriveKey"]);
    const key = await s.deriveKey(
      {
        name: "HKDF",
        hash: "SHA-256",
        salt: unb64u(init.salt),
        info: encoder.encode(`asbx-e2e-v1:${sessionId}`),
      },
      ikm,
      { name: "AES-GCM", length: 256 },
      false,
      ["encrypt", "decrypt"],
    );
    return new SessionCipher(key, sessionId);
  }
}

/** One session's AES-GCM key. */
export class SessionCipher {
  constructor(
    private readonly key: CryptoKey,
    readonly sessionId: string,
  ) {}

  /** The sealed fields of line `seq` of type `type`. */
  async openLine(seq: number, type: string, sealed: Sealed): Promise<Record<string, unknown>> {
    const plain = await this.open(`${this.sessionId}.${seq}.${type}`, sealed);
    const value: unknown = JSON.parse(plain);
    if (!value || typeof value !== "object" || Array.isArray(value)) {
      throw new AsbxError({ status: 0, code: "decryption_failed", detail: `line ${seq} is not an object` });
    }
    return value as Record<string, unknown>;
  }

  /** Seals a tool answer (`{"result"}` or `{"error"}`) for call `callId`. */
  async sealToolResult(callId: string, body: { result: unknown } | { error: string }): Promise<Sealed> {
    const iv = globalThis.crypto.getRandomValues(new Uint8Array(12));
    const ct = await subtle().encrypt(
      { name: "AES-GCM", iv, additionalData: encoder.encode(`${this.sessionId}.tool-result.${callId}`) },
      this.key,
      encoder.encode(JSON.stringify(body)),
    );
    return { iv: b64u(iv), ciphertext: b64u(new Uint8Array(ct)) };
  }

  private async open(aad: string, sealed: Sealed): Promise<string> {
    try {
      const plain = await subtle().decrypt(
        { name: "AES-GCM", iv: unb64u(sealed.iv), additionalData: encoder.encode(aad) },
        this.key,
        unb64u(sealed.ciphertext),
      );
      return decoder.decode(plain);
    } catch (cause) {
      throw new AsbxError({ status: 0, code: "decryption_failed", detail: `${aad} did not open`, cause });
    }
  }
}
