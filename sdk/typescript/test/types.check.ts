// Compiled (not run) by `npm run typecheck`: the published types narrow as
// a user expects, and misuse fails to compile.
import {
  AsbxClient,
  AsbxError,
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
