// The console at the size of a real fleet (issue 29): 1,250 machines of 8 GPUs beside the demo fleet. The
// Nodes tab is searched and paged, the Overview sums 10,000 GPUs, and both pass axe-core.
import AxeBuilder from "@axe-core/playwright";
import { expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

/** 1,250 machines named gpu-0000 to gpu-1249, each with eight 80 GB GPUs. */
function fleet(): string {
  const lines: string[] = [];
  for (let m = 0; m < 1250; m++) {
    const name = `gpu-${String(m).padStart(4, "0")}`;
    lines.push(`[[machine]]`, `name = "${name}"`, `cpu_cores = 128`, `memory_gb = 1024`);
    for (let g = 0; g < 8; g++) {
      lines.push(`[[machine.gpu]]`, `index = ${g}`, `uuid = "GPU-${name}-${g}"`, `model = "NVIDIA H100 80GB HBM3"`, `memory_gb = 80`);
    }
  }
  return lines.join("\n") + "\n";
}

test.use({ inventory: fleet() });

test("with 1,250 machines the nodes tab finds one by name and pages the rest, and the overview sums them", async ({ page }) => {
  await open(page, "/nodes");
  // The demo fleet's four machines and the 1,250.
  await expect(page.getByTestId("nodes-page")).toHaveText("Page 1 of 26 · 1254 of 1254 nodes");
  await expect(page.getByTestId("node-row")).toHaveCount(50);
  const violations = (await new AxeBuilder({ page }).analyze()).violations.filter(
    (v) => v.impact === "serious" || v.impact === "critical",
  );
  expect(violations.map((v) => v.id)).toEqual([]);

  await page.getByRole("button", { name: "Next" }).click();
  await expect(page.getByTestId("nodes-page")).toHaveText("Page 2 of 26 · 1254 of 1254 nodes");
  await expect(page).toHaveURL(/\/nodes\?page=2$/);

  await page.getByTestId("nodes-search").fill("gpu-0777");
  await expect(page.getByTestId("nodes-page")).toHaveText("Page 1 of 1 · 1 of 1254 nodes");
  await expect(page.getByTestId("node-row")).toHaveText(/gpu-0777/);
  await page.getByTestId("node-row").getByRole("link", { name: "gpu-0777" }).click();
  await expect(page).toHaveURL(/\/machines\/gpu-0777$/);

  await open(page, "/nodes?q=nothing-like-it");
  await expect(page.getByTestId("no-match")).toHaveText('No node, group or model holds "nothing-like-it".');

  await open(page, "/");
  await expect(page.getByTestId("machines")).toHaveText("1254");
  await expect(page.getByTestId("gpus")).toHaveText("10013");
});
