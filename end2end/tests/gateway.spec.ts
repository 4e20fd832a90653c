// The gateway's keys from the console: an admin makes a token for inference only, limited to one model;
// a script calls that model with it through /v1, is refused another model and the rest of the API, and the
// Usage page counts what it asked for.
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("an inference token limited to one model calls only it, and the usage page counts its requests", async ({ page, playwright, request, server }) => {
  const glm = await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "embedder", gpus: ["atlas:0"], share: 5, revision: glm.revision });
  await healthy(request, "glm-5.3");
  await healthy(request, "embedder");

  await open(page, "/admin");
  await page.getByLabel("What it is for").fill("chat");
  await expect(page.getByLabel("Models it may call")).toBeDisabled();
  await page.getByLabel("Only for inference").check();
  await page.getByLabel("Models it may call").fill("glm-5.3");
  await page.getByRole("button", { name: "Make the token" }).click();
  const secret = (await page.getByTestId("token-secret").locator("code").innerText()).trim();
  await page.reload();
  await expect(page.locator('tr[data-token="chat"]')).toContainText("inference: glm-5.3");

  const script = await playwright.request.newContext({ baseURL: server, extraHTTPHeaders: { Authorization: `Bearer ${secret}` } });
  const chat = (model: string) =>
    script.post("/v1/chat/completions", { data: { model, messages: [{ role: "user", content: "hello" }] } });
  const answer = await chat("glm-5.3");
  expect(answer.status(), await answer.text()).toBe(200);
  const refused = await chat("embedder");
  expect(refused.status()).toBe(403);
  expect((await refused.json()).error.code).toBe("model_not_allowed");
  expect((await script.get("/api/me")).status()).toBe(403);
  await script.dispose();

  await open(page, "/usage?period=24h&by=model");
  const requests = page.getByTestId("requests-table");
  await expect(requests.locator("tbody th")).toHaveText(["glm-5.3"]);
  await expect(requests.locator("tbody td").first()).toContainText("admin/chat (tsr_");
  const href = await page.getByTestId("requests-csv").getAttribute("href");
  const csv = await (await request.get(href!)).text();
  expect(csv.split("\n")[0]).toBe("model,key,requests,failed,prompt_tokens,completion_tokens");
  expect(csv.split("\n")[1]).toMatch(/^glm-5\.3,admin\/chat \(tsr_[0-9a-f]{6}…\),1,0,\d+,\d+$/);
});
