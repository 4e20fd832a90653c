// The machine page shows what an operator would otherwise open nvitop for: each GPU's utilisation, memory in
// use (Tessera's engines' and others'), temperature and power, now and over the last hour. The demo fleet's
// figures are made from its demo engines' work, and say so.
import { deploy, expect, healthy, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("each GPU shows its figures now and a chart of the last hour, the demo's marked as such", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await healthy(request, "glm-5.3");
  for (let i = 0; i < 20; i++) {
    const answer = await request.post("/v1/chat/completions", {
      data: { model: "glm-5.3", stream: true, messages: [{ role: "user", content: "hello there, how are you" }] },
    });
    expect(answer.status()).toBe(200);
  }
  // A reading every 5 s: two of them make a chart.
  await expect
    .poll(
      async () => {
        await open(page, "/machines/atlas");
        return page.locator('[data-testid="gpu"][data-index="0"] [data-testid="gpu-chart"]').count();
      },
      { timeout: 20_000, intervals: [2_000] },
    )
    .toBe(1);
  const gpu = page.locator('[data-testid="gpu"][data-index="0"]');
  await expect(gpu.getByTestId("gpu-now")).toHaveText(
    /^Now: \d+% busy · [\d.]+ of 96 GB in use \(38\.4 GB by Tessera's engines, [\d.]+ GB by others\) · \d+ °C · \d+ W \(demo figures, made from the demo engines' work\)$/,
  );
  await expect(gpu.getByRole("img", { name: /^GPU 0 over the last \d+ minutes: busy \d+–\d+%, memory in use \d+–\d+% of 96 GB$/ })).toBeVisible();
});
