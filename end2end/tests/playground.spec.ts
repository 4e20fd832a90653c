// The playground: pick a deployed model, chat with the answer streaming in through the gateway, see the
// same request as curl and the engine's last log lines; what is asked is counted under the account.
import AxeBuilder from "@axe-core/playwright";
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("the playground streams a model's answer, shows the request as curl and the engine's log lines", async ({ page, request }) => {
  // A word every 250 ms: the answer is seen growing before it is whole.
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40, env: { TESSERA_DEMO_TOKEN_MS: "250" } });
  await healthy(request, "glm-5.3");
  await open(page, "/playground");
  await expect(page.getByLabel("Model")).toHaveValue("glm-5.3");
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

  test("the playground says what went wrong when the model cannot answer", async ({ page, request }) => {
    // vision "loads" for ten minutes: it is listed, but no engine is ready within the gateway's wait.
    await deploy(request, { model: "vision", gpus: ["atlas:1"], share: 25, env: { TESSERA_DEMO_START_MS: "600000" } });
    await open(page, "/playground");
    await expect(page.getByLabel("Model")).toHaveValue("vision");
    await page.getByLabel("Message").fill("anyone there?");
    await page.getByRole("button", { name: "Send" }).click();
    await expect(page.getByTestId("chat-error")).toContainText("vision is deployed but none of its engines was ready", { timeout: 45_000 });
  });
});
