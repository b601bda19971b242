// Live stations: fetch the cards fragment every few seconds and swap it in (without JS: a meta refresh).
const live = document.querySelector("[data-live]");
if (live) {
  setInterval(async () => {
    try {
      const r = await fetch(live.dataset.live, { credentials: "same-origin" });
      if (r.ok) live.innerHTML = await r.text();
    } catch (e) { /* gateway or console restarting: try again next tick */ }
  }, Number(live.dataset.every) * 1000);
}
