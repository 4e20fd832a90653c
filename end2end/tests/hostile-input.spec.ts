// Hostile input is refused with a clear error, or shown as text: never run as script.
import { deploy, expect, test } from "./fixtures/tessera";
import { open } from "./fixtures/console";

const SCRIPT = "<script>alert(1)</script>";

test("a model named <script>alert(1)</script> is refused and shown as text, and runs nothing", async ({ page, request }) => {
  let dialogs = 0;
  page.on("dialog", async (d) => {
    dialogs++;
    await d.dismiss();
  });
  const refused = await request.post("/api/models", {
    data: { name: SCRIPT, engine: "command", default_share_percent: 10, group: null, model_path: "x", command: "x --port {port}" },
  });
  expect(refused.status()).toBe(422);
  expect((await refused.json()).error).toContain(`name "${SCRIPT}": use 1 to 63 letters`);

  // A name in a URL comes back in the page as text.
  await open(page, `/machines/${encodeURIComponent(SCRIPT)}`);
  await expect(page.getByRole("alert")).toContainText(`there is no machine named ${SCRIPT}`);

  // Arguments and variables are free text: stored as sent, shown as text.
  await deploy(request, { model: "vision", gpus: ["atlas:0"], share: 25, args: [SCRIPT], env: { NOTE: SCRIPT } });
  await open(page, "/models/vision/serving");
  await expect(page.getByLabel("Extra arguments")).toHaveValue(`'${SCRIPT}'`);
  await expect(page.getByLabel("Environment variables")).toHaveValue(`NOTE=${SCRIPT}`);
  await open(page, "/audit");
  await expect(page.getByTestId("audit-row").first()).toContainText(SCRIPT);
  expect(dialogs, "no script ran").toBe(0);
});
