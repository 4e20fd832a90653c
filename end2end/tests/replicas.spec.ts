// Replicas that follow traffic (issue 44): a model deployed on two GPUs with a most of two starts on one
// of them, and the wizard refuses more replicas than GPUs.
import { expect, test } from "./fixtures/tessera";
import { ModelsTab, open, Wizard } from "./fixtures/console";

/** Two machines alike, each with one 80 GB GPU: a group on both holds a member's share on each (no agent
 * runs there, so no engine starts: what is shown here is the plan's). */
test.use({
  inventory: ["east", "west"]
    .map((name) => `[[machine]]\nname = "${name}"\ncpu_cores = 32\nmemory_gb = 256\n[[machine.gpu]]\nindex = 0\nmodel = "NVIDIA H100 80GB HBM3"\nmemory_gb = 80\n`)
    .join(""),
});

test("a model deployed with a most of two replicas on two GPUs starts on one and says so, and the wizard refuses more replicas than GPUs", async ({ page, request }) => {
  const wizard = new Wizard(page);
  await wizard.open();
  await wizard.place("vision", ["east", "west"]);
  const sharing = page.getByRole("switch", { name: "GPU sharing" });
  if (!(await sharing.isChecked())) await sharing.check();
  const replicas = page.getByTestId("replicas");
  await expect(replicas).toContainText("each on one of the group's 2 GPUs");

  // Left empty: one on each machine, as any member. More than the GPUs: refused, Deploy blocked.
  await replicas.getByLabel("Most").fill("3");
  await expect(page.getByTestId("replicas-error")).toHaveText(
    "replicas.max (3) is more than the 2 GPU(s) of its group: each replica runs on a GPU of its own; choose more GPUs, or lower max",
  );
  await expect(wizard.deploy).toBeDisabled();
  await replicas.getByLabel("Most").fill("2");
  await expect(page.getByTestId("replicas-error")).toHaveCount(0);
  await expect(wizard.deploy).toBeEnabled();
  await wizard.deploy.click();

  await expect(page).toHaveURL(/\/models\?deployed=vision$/);
  const row = new ModelsTab(page).row("vision");
  await expect(row.getByTestId("replicas")).toHaveText("Replicas by load, 1 to 2 (target 1): 1 running.");
  const groups = await (await request.get("/api/groups")).json();
  const vision = groups.flatMap((g: any) => g.members).find((m: any) => m.name === "vision");
  expect([vision.replicas.min, vision.replicas.max, vision.replicas.running, vision.replicas.gpus.length]).toEqual([1, 2, 1, 1]);

  // The model's own page has its replicas: how many, and where.
  await open(page, "/models/vision");
  const panel = page.getByTestId("model-replicas");
  await expect(panel).toContainText("Replicas by load, 1 to 2 (target 1): 1 running.");
  await expect(panel).toContainText(`On: GPU 0 of ${vision.replicas.gpus[0].machine}.`);
});
