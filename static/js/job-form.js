// The job form: a dry run that says the job would be rejected turns Submit off (and says
// why beside it); the inputs are never touched, only the panel is swapped.
(function () {
  "use strict";
  function sync() {
    var panel = document.getElementById("dry-run");
    var submit = document.querySelector("[data-testid=submit]");
    var note = document.querySelector("[data-testid=submit-note]");
    if (!panel || !submit) return;
    var verdict = panel.querySelector("[data-verdict]");
    var rejected = !!verdict && verdict.getAttribute("data-verdict") === "rejected";
    submit.disabled = rejected;
    if (note) note.hidden = !rejected;
  }
  document.addEventListener("htmx:afterSwap", function (event) {
    if (event.target && event.target.id === "dry-run") sync();
  });
  document.addEventListener("DOMContentLoaded", sync);
})();
