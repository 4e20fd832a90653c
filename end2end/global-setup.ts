// cargo-leptos starts the server and this suite at the same moment: wait until the server answers.
import type { FullConfig } from "@playwright/test";

export default async function globalSetup(config: FullConfig): Promise<void> {
  const base = config.projects[0].use.baseURL ?? "http://127.0.0.1:3000";
  const deadline = Date.now() + 180_000;
  let last = "";
  while (Date.now() < deadline) {
    try {
      const response = await fetch(`${base}/api/health`);
      if (response.ok) return;
      last = `status ${response.status}`;
    } catch (e) {
      last = String(e);
    }
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
  throw new Error(`the server at ${base} did not answer within 180 s (${last})`);
}
