// Seed 002's interference alarm in the console: a model that answers twice as slowly while its neighbour is
// busy is flagged on the Models tab and on its machine page, naming the neighbour.
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { ModelsTab, open } from "./fixtures/console";

test("a model slowed by a busy neighbour is flagged on the Models tab and its machine page, naming the neighbour", async ({ page, playwright, request }) => {
  const glm = await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25, revision: glm.revision });
  await healthy(request, "glm-5.3");
  await healthy(request, "vision");
  const chat = (model: string, stream = false) =>
    request.post("/v1/chat/completions", {
      data: { model, stream, messages: [{ role: "user", content: "hello there, how are you" }] },
    });
  // Alone: glm-5.3's baseline.
  for (let i = 0; i < 100; i++) expect((await chat("glm-5.3")).status()).toBe(200);

  // vision gets busy; glm-5.3's demo engine is told to slow down beside it.
  let busy = true;
  const load = [0, 1, 2].map(async () => {
    while (busy) expect((await chat("vision", true)).status()).toBe(200);
  });
  await new Promise((done) => setTimeout(done, 300));
  const engines = await (await request.get("/api/engines")).json();
  const port = engines.find((e: any) => e.model === "glm-5.3").port;
  const engine = await playwright.request.newContext({ baseURL: `http://127.0.0.1:${port}` });
  // Slow enough to stand out of a baseline that a loaded machine makes noisy: the judge flags a p99 1.5×
  // the p99 alone, and beside the Ray suite one request in a hundred alone may take a few hundred ms (60 ms
  // did not stand out once in six CI runs, 200 ms once in four).
  expect((await engine.post("/slow", { data: { ms: 600 } })).status()).toBe(204);
  for (let i = 0; i < 30; i++) expect((await chat("glm-5.3")).status()).toBe(200);
  busy = false;
  await Promise.all(load);
  expect((await engine.post("/slow", { data: { ms: 0 } })).status()).toBe(204);
  await engine.dispose();

  const slowed = /^Slowed by its neighbours: p99 \d+\.\d\d× its p99 alone \(\d+ ms against \d+ ms\); busy beside it: vision\.$/;
  await expect
    .poll(async () => (await (await request.get("/api/audit?target=glm-5.3")).json()).map((e: any) => e.action))
    .toContain("model.interference");
  await open(page, "/models");
  await expect(new ModelsTab(page).row("glm-5.3").getByTestId("slowed")).toHaveText(slowed);
  await open(page, "/machines/atlas");
  await expect(page.getByTestId("gpu-slowed")).toHaveText([new RegExp(`^glm-5\\.3: ${slowed.source.slice(1)}`)]);
});
