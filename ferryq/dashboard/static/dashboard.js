// ferryq dashboard: keeps the page's live part up to date without reloading.
// Every few seconds it fetches the same address with the X-Ferryq-Fragment header,
// gets the live part alone (rendered and escaped on the server), and swaps it in,
// keeping ticked checkboxes ticked. It pauses while the tab is hidden or while an
// input inside the live part has focus, and stops once the session has ended.
(function () {
  "use strict";

  var live = document.getElementById("live");
  var status = document.getElementById("live-status");

  function say(text) {
    if (status) status.textContent = text;
  }

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box && box.matches && box.matches("input[data-select-all]") && box.form) {
      box.form.querySelectorAll("input[name=ids]").forEach(function (each) {
        each.checked = box.checked;
      });
    }
  });

  if (!live) return;
  var interval = parseInt(live.getAttribute("data-live-interval") || "3000", 10);
  var busy = false;
  var stopped = false;

  function paused() {
    var focused = document.activeElement;
    return document.hidden || (focused && focused !== document.body && live.contains(focused) &&
      focused.matches("input, select, textarea"));
  }

  function swap(html) {
    var ticked = {};
    live.querySelectorAll("input[type=checkbox]:checked").forEach(function (box) {
      ticked[box.name + "=" + box.value] = true;
    });
    var holder = document.createElement("template");
    holder.innerHTML = html;
    holder.content.querySelectorAll("input[type=checkbox]").forEach(function (box) {
      if (ticked[box.name + "=" + box.value]) box.checked = true;
    });
    live.replaceChildren(holder.content);
    live.setAttribute("data-updated", String(Date.now()));
    say("live · " + new Date().toLocaleTimeString());
  }

  function refresh() {
    if (busy || stopped || paused()) return;
    busy = true;
    fetch(window.location.href, {
      headers: { "X-Ferryq-Fragment": "1" },
      credentials: "same-origin",
      cache: "no-store",
      redirect: "error"
    }).then(function (response) {
      if (response.status === 401) {
        stopped = true;
        say("signed out: reload to sign in");
        return null;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      return response.text();
    }).then(function (html) {
      if (html !== null) swap(html);
    }).catch(function () {
      say("live · update failed, retrying");
    }).finally(function () {
      busy = false;
    });
  }

  say("live");
  window.setInterval(refresh, interval);
})();
