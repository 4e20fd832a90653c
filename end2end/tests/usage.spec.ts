// The Usage page (seed 000): GPU-hours split among sharers, a chart drawn on the server, and the same
// report as CSV.
import { deploy, expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

test("the usage page lists each machine's GPU time, charts it stacked with its unit and a total, and offers the same as CSV", async ({ page, request }) => {
  await deploy(request, { model: "glm-5.3", gpus: ["atlas:0"], share: 40 });
  await open(page, "/usage?period=24h&by=model");
  await expect(page.getByLabel("Period")).toHaveValue("24h");
  await expect(page.getByLabel("By")).toHaveValue("model");
  const table = page.getByTestId("usage-table");
  await expect(table.locator("tbody th")).toHaveText(["glm-5.3"]);
  await expect(page.getByRole("img", { name: /^GPU-hours: glm-5.3/ })).toBeVisible();
  // Bars with their unit, stacked busy over held where readings say, and the total under them.
  await expect(page.getByTestId("usage-chart-total")).toHaveText(/^[\d.]+ GPU-h( \([\d.—]+ busy\))?$/);
  await expect(page.getByTestId("usage-chart").locator("rect.idle")).toHaveCount(1);
  await expect(table.locator("tfoot th")).toHaveText("Total");
  const href = await page.getByTestId("usage-csv").getAttribute("href");
  expect(href).toMatch(/^\/api\/usage\.csv\?from=.*&by=model$/);
  const csv = await (await request.get(href!)).text();
  expect(csv.split("\n")[0]).toBe("model,gpu_hours,busy_gpu_hours,energy_wh");
  expect(csv.split("\n")[1]).toMatch(/^glm-5\.3,/);
  await page.getByLabel("By").selectOption("machine");
  await page.getByRole("button", { name: "Show" }).click();
  await expect(page).toHaveURL(/by=machine/);
  await expect(table.locator("tbody th")).toHaveText(["atlas"]);
  await page.screenshot({ path: test.info().outputPath("usage.png"), fullPage: true });
});
