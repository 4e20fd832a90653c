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

  // Its fewest and most change there, with no engine restarting; what cannot be is refused with why.
  const form = page.getByTestId("replicas-form");
  await form.getByLabel("Most").fill("3");
  await form.getByRole("button", { name: "Save replicas" }).click();
  await expect(panel.getByTestId("replicas-error")).toHaveText(
    "replicas.max (3) is more than the 2 GPU(s) of its group: each replica runs on a GPU of its own; choose more GPUs, or lower max",
  );
  await form.getByLabel("Fewest").fill("0");
  await form.getByLabel("Most").fill("1");
  await form.getByRole("button", { name: "Save replicas" }).click();
  await expect(panel).toContainText("Replicas by load, 0 to 1 (target 1): 1 running.");
  const audit = await (await request.get("/api/audit?action=model.replicas")).json();
  expect(audit[0].after).toMatchObject({ min: 0, max: 1 });
});

test("a plan whose GPUs hold fewer replicas than its most is warned, not refused, saying why the rest wait, and deploys", async ({ page, request }) => {
  // speech runs on east and west at 10 % (8 GB each); other shared work takes 60 GB of west.
  const speech = await request.post("/api/deployments", { data: { model: "speech", gpus: ["east:0", "west:0"], share: 10 } });
  expect(speech.status()).toBe(201);
  const filler = await request.post("/api/workers", {
    data: { name: "filler", requested_resources: { gpu_requests: { count: 1, ids: ["west:0"], shared: true, memory_gb: 60 } } },
  });
  expect(filler.status()).toBe(201);
  const wizard = new Wizard(page);
  await wizard.open();
  await wizard.place("vision", ["east", "west"]);

  // One engine on each machine needs west's room too: refused, in the seed's words.
  await expect(wizard.panel.verdict).toContainText("GPU 0 of west: 60 of 80 GB taken by shared work; it needs 28");
  await expect(wizard.deploy).toBeDisabled();

  // Replicas hold the share only where they run: one fits on east, the other waits for room.
  await page.getByTestId("replicas").getByLabel("Most").fill("2");
  await expect(wizard.panel.verdict).toContainText("The shares add up to 35% of one accelerator, which fits.");
  await expect(wizard.panel.verdict).toContainText(
    "vision: 1 of its 2 replicas fits now; the other one waits for room: GPU 0 of west: 68 of 80 GB taken by shared work; it needs 20",
  );
  await expect(wizard.deploy).toBeEnabled();
  await wizard.deploy.click();

  await expect(page).toHaveURL(/\/models\?deployed=vision$/);
  await expect(new ModelsTab(page).row("vision").getByTestId("replicas")).toHaveText("Replicas by load, 1 to 2 (target 1): 1 running.");
  const groups = await (await request.get("/api/groups")).json();
  const vision = groups.flatMap((g: any) => g.members).find((m: any) => m.name === "vision");
  expect(vision.replicas.gpus).toEqual([{ machine: "east", index: 0 }]);
});

test("a model deployed without replicas takes them on its own page, its engines restarting one to a GPU, and gives them up again", async ({ page, request }) => {
  const speech = await request.post("/api/deployments", { data: { model: "speech", gpus: ["east:0", "west:0"], share: 10 } });
  expect(speech.status()).toBe(201);
  await open(page, "/models/speech");
  const panel = page.getByTestId("model-replicas");
  await expect(panel.getByTestId("model-replicas-line")).toHaveText(
    "None: an engine on each machine of its group. Type a most to have replicas that follow its load, each on a GPU of its own (its engines restart).",
  );

  // A most: it takes replicas, its first on one GPU; its engines restart.
  const form = page.getByTestId("replicas-form");
  await form.getByLabel("Most").fill("2");
  await form.getByRole("button", { name: "Save replicas" }).click();
  await expect(panel.getByTestId("replicas-saved")).toHaveText("Saved: 1 to 2; its engines restart, one on each GPU a replica is placed on.");
  await expect(panel.getByTestId("model-replicas-line")).toHaveText("Replicas by load, 1 to 2 (target 1): 1 running.");
  const member = async () =>
    ((await (await request.get("/api/groups")).json()) as any[]).flatMap((g) => g.members).find((m) => m.name === "speech");
  expect((await member()).replicas.gpus).toHaveLength(1);

  // The most left empty: no replicas, an engine on each machine again.
  await form.getByLabel("Most").fill("");
  await form.getByRole("button", { name: "Save replicas" }).click();
  await expect(panel.getByTestId("replicas-saved")).toHaveText("Saved: no replicas; its engines restart, one on each machine of its group.");
  await expect(panel.getByTestId("model-replicas-line")).toContainText("None: an engine on each machine of its group.");
  expect((await member()).replicas ?? null).toBeNull();
  const audit = await (await request.get("/api/audit?action=model.replicas")).json();
  expect([audit[0].before.max, audit[0].after, audit[1].before, audit[1].after.max]).toEqual([2, null, null, 2]);
});
