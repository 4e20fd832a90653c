// The playground: pick a deployed model, chat with the answer streaming in through the gateway, see the
// same request as curl and the engine's last log lines; what is asked is counted under the account.
import AxeBuilder from "@axe-core/playwright";
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("the playground offers deployed models, not workers, streams an answer, shows the request as curl and whose log lines it shows", async ({ page, request }) => {
  // A word every 250 ms: the answer is seen growing before it is whole.
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40, env: { TESSERA_DEMO_TOKEN_MS: "250" } });
  await healthy(request, "glm-5.3");
  // A worker runs a job, not a chat: it is not offered.
  const worker = await request.post("/api/workers", {
    data: { name: "batch-embed", requested_resources: { gpu_requests: { count: 1, shared: true, memory_gb: 2 } } },
  });
  expect(worker.status(), await worker.text()).toBe(201);
  await open(page, "/playground");
  await expect(page.getByLabel("Model")).toHaveValue("glm-5.3");
  await expect(page.getByLabel("Model").locator("option")).toHaveText(["glm-5.3"]);
  await expect(page.getByTestId("log-engine")).toHaveText("From its engine on atlas: Serving.");
  await expect(page.getByTestId("engine-logs")).toContainText("loaded; serving on");

  await page.getByLabel("Message").fill("hello there");
  const curl = page.getByTestId("curl");
  await expect(curl).toContainText("/v1/chat/completions");
  await expect(curl).toContainText('-H "Authorization: Bearer $TESSERA_TOKEN"');
  await expect(curl).toContainText('{"model":"glm-5.3","messages":[{"role":"user","content":"hello there"}],"stream":true}');

  await page.getByRole("button", { name: "Send" }).click();
  const answering = page.getByTestId("answering");
  await expect(answering).toContainText("demo engine");
  await expect(answering).not.toContainText("heard: hello there");
  const chat = page.getByTestId("chat");
  await expect(chat.locator(".said-assistant")).toContainText("heard: hello there", { timeout: 15_000 });
  await expect(answering).toHaveCount(0);
  await expect(chat.locator(".said-user")).toHaveText(["user hello there"]);

  const results = await new AxeBuilder({ page }).analyze();
  const bad = results.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  expect(bad.map((v) => v.id)).toEqual([]);
  await page.screenshot({ path: test.info().outputPath("playground.png"), fullPage: true });

  const report = await (await request.get("/api/usage")).json();
  expect(report.requests.map((r: { model: string; key: string; requests: number }) => [r.model, r.key, r.requests])).toEqual([
    ["glm-5.3", "admin (console)", 1],
  ]);
});

test.describe("with a gateway that waits 3 s for an engine", () => {
  // The server's own wait (30 s) is what it is whatever the test: a shorter one says the same sooner.
  test.use({ gatewayWaitS: 3 });

  test("the playground says beside the turn what went wrong when the model cannot answer, keeps it there, and does not send that turn again", async ({ page, request }) => {
    // vision "loads" for ten minutes: it is listed, but no engine is ready within the gateway's wait.
    await deploy(request, { model: "vision", gpus: ["atlas:1"], share: 25, env: { TESSERA_DEMO_START_MS: "600000" } });
    await open(page, "/playground");
    await expect(page.getByLabel("Model")).toHaveValue("vision");
    await expect(page.getByTestId("log-engine")).toHaveText("From its engine on atlas: Starting.");
    await page.getByLabel("Message").fill("anyone there?");
    await page.getByRole("button", { name: "Send" }).click();
    const failed = page.getByTestId("chat-error");
    await expect(failed).toContainText("vision is deployed but none of its engines was ready", { timeout: 45_000 });
    await expect(page.locator(".said-user.unanswered")).toContainText("anyone there?");
    // The next message goes alone: the unanswered one is not asked again, and its error stays in sight.
    await page.getByLabel("Message").fill("and now?");
    await expect(page.getByTestId("curl")).toContainText('"messages":[{"role":"user","content":"and now?"}]');
    await page.getByRole("button", { name: "Send" }).click();
    await expect(failed).toHaveCount(2, { timeout: 45_000 });
    await expect(page.locator(".said-user.unanswered")).toHaveText([/anyone there\?/, /and now\?/]);
    // The Models tab counts them against the model, this hour.
    await open(page, "/models");
    await expect(page.locator('[data-testid="model-row"][data-model="vision"]').getByTestId("errors")).toHaveText("2 of 2 (100.0%)");
    await expect(page.locator('[data-testid="model-row"][data-model="vision"]').getByTestId("restarts")).toHaveText("0");
  });
});
