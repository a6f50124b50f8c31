// Drives Debian's Chromium (playwright-core) against a running rollgate
// controller's dashboard, one check per run; crates/rollgate/tests/dashboard.rs
// starts the stack and runs each check. Every check fails (exit 1) on a
// console error or an uncaught page error, and every wait is bounded.
//
//   node dashboard.mjs CHECK BASE_URL TOKEN ARG... (env ROLLGATE_CHROMIUM)
//
//   follow ID SHOT       sees rollout ID in SHADOW, prints "seen shadow",
//                        then sees it reach PROMOTED; screenshot to SHOT;
//                        prints the phases the page showed, in order
//   why MODEL ID SHOT    from the model's page, one click on rollout ID:
//                        the reason and the deciding bound are on the page
//   abort ID             aborts rollout ID from the page, with a reason
//   viewer ID            a viewer sees rollout ID without action buttons
//   axes ID              rollout ID's plots: the e-value on a log axis
//                        (decade ticks), elapsed time on the x axis up
//                        to the rollout's length, the candidate beside
//                        the champion for rates and latency, round
//                        numbers; prints "axes {...}"
//   lag                  the overview with the controller's answer to
//                        /api/v1/leader changed to say a rollout waited
//                        5 s at a 1 s tick: the "behind" warning shows,
//                        with the wait; at 1.2 s (within 1.5 ticks) it
//                        goes on the next refresh
//   weigh ID             bytes transferred for the page and rollout ID's
//                        view, and the time until its plots are drawn
import { chromium } from "playwright-core";

const [check, base, token, ...args] = process.argv.slice(2);
const TIMEOUT = 60_000;
const problems = [];

function fail(msg) {
  console.error(`FAIL ${check}: ${msg}`);
  process.exitCode = 1;
}

// Playwright starts Chromium with a fresh, temporary profile of its own.
const browser = await chromium.launch({
  executablePath: process.env.ROLLGATE_CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
    "--disable-quic", "--disable-component-update", "--disable-sync"],
  headless: true,
  timeout: TIMEOUT,
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 1000 } });
  // The token as the sign-in form would keep it.
  await context.addInitScript((t) => sessionStorage.setItem("rollgate.token", t), token);
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  page.on("console", (m) => { if (m.type() === "error") problems.push(`console: ${m.text()}`); });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  await run(page);
  await context.close();
} catch (e) {
  fail(e.stack || String(e));
} finally {
  await browser.close();
}
if (problems.length) fail(problems.join("\n"));

async function open(page, hash) {
  await page.goto(`${base}/dashboard/?refresh=250${hash}`);
  await page.waitForSelector("body[data-ready=true]");
}

function phaseOf(page) {
  return page.getAttribute("h1 [data-phase]", "data-phase", { timeout: 1000 });
}

async function run(page) {
  switch (check) {
    case "follow": {
      const [id, shot] = args;
      await open(page, `#/rollouts/${id}`);
      const seen = [];
      let announced = false;
      const deadline = Date.now() + 120_000;
      while (Date.now() < deadline) {
        const p = await phaseOf(page).catch(() => null);
        const weight = p === "canary" ? await page.textContent("h1 [data-phase]") : p;
        if (weight && seen[seen.length - 1] !== weight) {
          seen.push(weight);
          if (p === "shadow" && !announced) { announced = true; console.log("seen shadow"); }
        }
        if (p === "promoted" || p === "rolled_back" || p === "aborted") break;
        await page.waitForTimeout(100);
      }
      console.log(`phases ${JSON.stringify(seen)}`);
      if (seen[seen.length - 1] !== "promoted") fail(`did not end PROMOTED: ${seen}`);
      if (!seen.includes("shadow")) fail(`never showed SHADOW: ${seen}`);
      if (seen.indexOf("shadow") > seen.findIndex((s) => s.startsWith("CANARY"))) fail(`SHADOW after CANARY: ${seen}`);
      // Give the page one refresh with the final record, then keep it.
      await page.waitForSelector("[data-gate] svg polyline", { state: "attached", timeout: 15_000 });
      await page.waitForTimeout(600);
      const why = await page.textContent("[data-phase-line]");
      if (!why.includes("PROMOTED")) fail(`phase line: ${why}`);
      await page.screenshot({ path: shot, fullPage: true });
      break;
    }
    case "why": {
      const [model, id, shot] = args;
      await open(page, `#/models/${encodeURIComponent(model)}`);
      await page.click(`[data-rollout="${id}"]`);
      await page.waitForSelector("[data-phase-line]").catch(async (e) => {
        // Say what the page shows instead (an error it caught, or where it is).
        const said = await page.textContent("#updated").catch(() => "?");
        const main = await page.textContent("main").catch(() => "?");
        fail(`no rollout view; the page says ${JSON.stringify(said)} at ${page.url()}: ${String(main).slice(0, 300)}`);
        throw e;
      });
      await page.waitForSelector("[data-gate] svg polyline", { state: "attached", timeout: 15_000 });
      const why = await page.textContent("[data-phase-line]");
      const verdict = await page.textContent("#verdict");
      console.log(`why ${why}`);
      console.log(`verdict ${verdict}`);
      if (!why.includes("ROLLED BACK")) fail(`no rollback reason on the page: ${why}`);
      // The deciding bound: the gate's FAIL line with its interval or e-value.
      if (!/FAIL/.test(verdict) || !/(difference in \[|e-value \d)/.test(verdict)) fail(`no deciding bound: ${verdict}`);
      if ((await page.locator("[data-gate] circle.failpt").count()) === 0) fail("the failing evaluation is not marked on the plot");
      await page.screenshot({ path: shot, fullPage: true });
      break;
    }
    case "abort": {
      const [id] = args;
      // Every read of the rollout takes 300 ms, longer than the page's
      // refresh: the reason box is opened while a redraw is fetching, and
      // must survive that redraw (it once did not).
      await page.route("**/api/v1/rollouts/**", async (route) => {
        await new Promise((done) => setTimeout(done, 300));
        await route.continue();
      });
      await open(page, `#/rollouts/${id}`);
      await page.click('[data-action="abort"]');
      await page.fill('[data-reason="abort"]', "aborted from the dashboard");
      await page.click('[data-confirm="abort"]');
      await page.waitForFunction(() => document.querySelector("h1 [data-phase]")?.dataset.phase === "aborted");
      console.log(`after abort ${await page.textContent("[data-phase-line]")}`);
      if (await page.isVisible('[data-action="abort"]')) fail("an ended rollout still offers abort");
      break;
    }
    case "viewer": {
      const [id] = args;
      await open(page, `#/rollouts/${id}`);
      const who = await page.textContent("#who");
      if (!who.includes("viewer")) fail(`not signed in as a viewer: ${who}`);
      const buttons = await page.locator("[data-action], [data-confirm], #actions").count();
      if (buttons !== 0) fail(`a viewer is offered ${buttons} action buttons`);
      const phase = await phaseOf(page);
      console.log(`viewer sees ${phase} and ${buttons} action buttons`);
      break;
    }
    case "lag": {
      // The controller's own answer, with its cadence set here: whether a
      // real controller is behind depends on the machine's speed.
      let lag = 5;
      await page.route("**/api/v1/leader", async (route) => {
        const real = await (await route.fetch()).json();
        if (!real.cadence) fail(`no cadence in ${JSON.stringify(real)}`);
        real.cadence = { ...real.cadence, tick_seconds: 1, lag_seconds: lag };
        await route.fulfill({ json: real });
      });
      await open(page, "");
      const said = await page.textContent("#lag", { timeout: 15_000 });
      console.log(`lag ${said}`);
      if (!said.includes("5.0 s")) fail(`the warning does not say the wait: ${said}`);
      lag = 1.2;
      await page.waitForSelector("#lag", { state: "detached", timeout: 15_000 });
      break;
    }
    case "weigh": {
      const [id] = args;
      await open(page, `#/rollouts/${id}`);
      await page.waitForSelector("[data-gate] svg polyline", { state: "attached", timeout: 15_000 });
      // From the start of the navigation by the page's own clock (the
      // browser's start-up is not counted) to the plots in the document.
      const drawn = Math.round(await page.evaluate(() => performance.now()));
      const sizes = await page.evaluate(() => {
        const nav = performance.getEntriesByType("navigation")[0];
        // The first load of each file (later ones are the live refresh).
        const seen = new Set();
        const files = [];
        for (const r of performance.getEntriesByType("resource")) {
          const path = new URL(r.name).pathname + new URL(r.name).search;
          if (seen.has(path)) continue;
          seen.add(path);
          files.push([path, r.transferSize, Math.round(r.duration)]);
        }
        return { page: nav.transferSize, files };
      });
      const total = sizes.page + sizes.files.reduce((a, [, n]) => a + n, 0);
      console.log(JSON.stringify({ drawn_ms: drawn, transferred_bytes: total, ...sizes,
        points: await page.locator("[data-gate]").count() }));
      break;
    }
    case "axes": {
      const [id] = args;
      await open(page, `#/rollouts/${id}`);
      await page.waitForSelector('[data-gate="error_rate"] svg.arms polyline.candidate', { state: "attached", timeout: 15_000 });
      const r = await page.evaluate(async (id) => {
        const t = sessionStorage.getItem("rollgate.token");
        const res = await fetch(`/api/v1/rollouts/${id}`, { headers: { authorization: `Bearer ${t}` } });
        return res.json();
      }, id);
      const lengthS = (r.updated_at - r.created_at) / 1000;
      const texts = (sel) => page.locator(sel).allTextContents();
      const e = '[data-gate="error_rate"] svg.plot:not(.arms)';
      const scale = await page.getAttribute(e, "data-scale");
      const yticks = await texts(`${e} text.ytick`);
      const xticks = await texts(`${e} text.xtick`);
      const limit = await texts(`${e} text.limit-label`);
      const arms = {};
      for (const gate of ["error_rate", "latency"]) {
        const a = `[data-gate="${gate}"] svg.arms`;
        arms[gate] = {
          candidate: await page.locator(`${a} polyline.candidate`).count(),
          champion: await page.locator(`${a} polyline.champion`).count(),
          legend: await texts(`${a} text.legend`),
        };
      }
      const verdict = await page.textContent("#verdict");
      const summary = { scale, yticks, xticks, limit, arms, length_s: lengthS };
      console.log(`axes ${JSON.stringify(summary)}`);
      if (scale !== "log") fail(`the e-value is plotted on a ${scale} axis`);
      const decades = yticks.map(Number);
      if (decades.length < 2 || !decades.every((v) => v > 0 && Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-9)) fail(`log ticks are not powers of ten: ${yticks}`);
      if (!limit.length || !/^fails at \d/.test(limit[0])) fail(`no threshold label: ${limit}`);
      const seconds = (t) => { const m = t.match(/^(?:(\d+) h)? ?(?:(\d+) min)? ?(?:([\d.]+) s)?$/); return m ? (+(m[1] || 0)) * 3600 + (+(m[2] || 0)) * 60 + (+(m[3] || 0)) : NaN; };
      const xs = xticks.map(seconds);
      if (xs.length < 3 || xs[0] !== 0 || xs.some(isNaN) || xs.some((v, i) => i && v <= xs[i - 1])) fail(`time ticks: ${xticks}`);
      if (xs[xs.length - 1] > lengthS + 1 || xs[xs.length - 1] < lengthS / 3) fail(`time ticks ${xticks} do not span the rollout's ${lengthS} s`);
      for (const [gate, a] of Object.entries(arms)) {
        if (a.candidate !== 1 || a.champion !== 1) fail(`${gate}: arms not side by side: ${JSON.stringify(a)}`);
      }
      const long = (verdict + yticks.join(" ") + JSON.stringify(arms)).match(/\d\.\d{5,}|\d{7,}/);
      if (long) fail(`a number not rounded for reading: ${long[0]} in ${verdict}`);
      break;
    }
    default:
      fail(`unknown check ${check}`);
  }
}
