// Compiled (not run) by `npm run typecheck`: the published types narrow as
// a user expects, and misuse fails to compile.
import {
  AsbxClient,
  AsbxError,
  ERROR_CODES,
  type AgentDefinition,
  type AgentRecord,
  type ErrorCode,
  type EventType,
  type KnownErrorCode,
  type ChatEvent,
  type RunEvent,
  type TerminationInfo,
  type WorkspaceComponents,
  type WorkspacePaths,
} from "@asbx/sdk";

const client = new AsbxClient({ baseUrl: "http://127.0.0.1:1", apiKey: "k" });

export async function runs(): Promise<TerminationInfo | undefined> {
  const run = client.runs.create({
    prompt: "x",
    encrypt: true,
    filter: { blockedTypes: ["log"] },
    tools: { pick: { handler: (args: { n: number }) => args.n + 1 } },
  });
  // A run from a chat's kept working directory (CONTRACT §11).
  client.runs.create({ prompt: "x", workdir: { from: "chat", afterMessageId: "m" } });
  // @ts-expect-error `from` is required
  client.runs.create({ prompt: "x", workdir: { afterMessageId: "m" } });
  for await (const ev of run) {
    const e: RunEvent = ev;
    if (e.type === "delta") {
      const text: string = e.text;
      void text;
      // @ts-expect-error a delta has no callId
      void e.callId;
    }
    if (e.type === "session_ended") {
      const t: TerminationInfo = e;
      const ms: number = e.stats.durationMs;
      void t;
      void ms;
    }
    if (e.type === "tool_call") await run.respond(e.callId, { result: 1 });
  }
  // @ts-expect-error a filter names line types only
  client.runs.create({ prompt: "x", filter: { types: ["nope"] } });
  return run.termination;
}

export async function chats(): Promise<void> {
  const turn = client.chat({ message: "hi", settings: { systemPrompt: "s" } });
  for await (const ev of turn) {
    const e: ChatEvent = ev;
    if (e.type === "turn") void e.chatId;
    if (e.type === "done") void (e.status satisfies "succeeded" | "failed" | "cancelled");
  }
  try {
    await client.chats.get("id", { limit: 10 });
  } catch (err) {
    if (err instanceof AsbxError) void err.errors.map((f) => f.field);
  }
}

// The REST types are the OpenAPI document's (generated): an environment's
// timestamps are numbers and its secrets are names only.
export async function generated(): Promise<void> {
  const env = await client.environments.create({ name: "e" });
  const created: number = env.createdAt;
  const names: string[] = env.secretNames;
  void created;
  void names;
  // @ts-expect-error the document answers secret names, never values
  void env.secrets;
  const models = await client.models();
  const first: WorkspaceComponents["schemas"]["ModelInfo"] | undefined = models[0];
  void first;
  type Create = WorkspacePaths["/api/environments"]["post"]["requestBody"];
  const body: NonNullable<Create>["content"]["application/json"] = { name: "x" };
  void body;
}

// The unions are generated from schemas/: every line type has its event
// type, and no event type is missing from the schema.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
export const lineTypesMatch: Same<RunEvent["type"], EventType> = true;
export const knownCode: KnownErrorCode = "attachment_failed";
export const agentCode: ErrorCode = "a_code_of_the_agents_own";
// @ts-expect-error a known code is one the schema lists
export const unknownCode: KnownErrorCode = "nope";
export const allCodes: readonly KnownErrorCode[] = ERROR_CODES;

// Stored agents: the definition and the record are the OpenAPI document's.
export async function agents(): Promise<TerminationInfo | undefined> {
  const made: AgentRecord = await client.agents.create({ name: "a", systemPrompt: "s", limits: { max_steps: 3 } });
  const id: string = made.id;
  const at: number = made.updatedAt;
  void at;
  // @ts-expect-error a definition needs a name
  await client.agents.create({ systemPrompt: "s" });
  // @ts-expect-error unknown fields are refused by the document
  await client.agents.update(id, { name: "a", sandboxUrl: "http://x" });
  const all: AgentRecord[] = await client.agents.list();
  void all;
  const def: AgentDefinition = { ...(await client.agents.get(id)), name: "b" };
  await client.agents.update(id, def);
  const run = client.agents.run(id, { prompt: "x", filter: { types: ["delta"] } });
  // @ts-expect-error an agent's run takes its settings from the agent
  client.agents.run(id, { prompt: "x", model: "m" });
  for await (const ev of run) void ev.seq;
  await client.agents.delete(id);
  return run.termination;
}

// A run's record is the document's `RunRecord`: a stored agent's run names it.
export async function runRecord(id: string): Promise<string | null | undefined> {
  const info = await client.runs.get(id);
  const kind: "run" | "chat" | "agent" = info.kind;
  void kind;
  // @ts-expect-error the record has no such field
  void info.nope;
  return info.agentId;
}
