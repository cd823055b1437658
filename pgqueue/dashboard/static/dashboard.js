// pgqueue dashboard: re-fetch the page's live part every data-refresh seconds and swap it in.
// The server renders it (autoescaped); this script only moves HTML it was given.
"use strict";

(function () {
  const seconds = Number(document.body.dataset.refresh || "0");
  const live = document.getElementById("live");
  const stamp = document.getElementById("updated");
  const show = (text) => { if (stamp) { stamp.textContent = text; } };
  show("updated " + new Date().toLocaleTimeString());
  if (!live || !(seconds > 0)) { return; }
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    try {
      const url = new URL(window.location.href);
      url.searchParams.set("fragment", "1");
      url.searchParams.delete("done");
      url.searchParams.delete("n");
      const answer = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (answer.ok) {
        live.innerHTML = await answer.text();
        show("updated " + new Date().toLocaleTimeString());
        document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || "0") + 1);
      } else {
        show("refresh failed (" + answer.status + "), retrying");
      }
    } catch (err) {
      show("cannot reach the dashboard, retrying");
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
