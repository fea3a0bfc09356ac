/* The dashboards on the website respond to their controls: tools/site_data.py computed each offered setting's
   figures and findings with the dashboard's own code when the site was built; tools/site.py draws the controls and
   the figure of the default setting and puts every setting's files and texts into a JSON script; moving a slider or
   a switch here shows that setting's figure, its alt text, the effective-batch line and the findings. */
(function () {
  "use strict";
  function wire(box) {
    const data = JSON.parse(box.querySelector("script.web-dashboard-data").textContent);
    const controls = [...box.querySelectorAll("[data-part]")];
    function key() {
      const part = {micro_batch_size: "", accum_steps: "", extra: ""};
      for (const control of controls) {
        if (control.type === "range") {
          const keys = JSON.parse(control.dataset.keys), labels = JSON.parse(control.dataset.labels);
          part[control.dataset.part] = keys[Number(control.value)];
          control.parentElement.querySelector("output").textContent = labels[Number(control.value)];
        } else if (control.type === "checkbox" && control.checked) {
          part.extra = control.dataset.switch;
        }
      }
      return `${part.micro_batch_size}|${part.accum_steps}|${part.extra}`;
    }
    function show() {
      const frame = data.frames[key()];
      if (!frame) return;
      const images = box.querySelectorAll("img.lesson-figure");
      frame.images.forEach(([file, alt], i) => {
        if (!images[i]) return;
        images[i].src = data.base + file;
        images[i].alt = alt;
      });
      box.querySelector(".wd-readout").innerHTML = frame.readout;
      box.querySelector(".wd-summary").textContent = data.shown + "\n" + frame.summary;
    }
    for (const control of controls) {
      control.disabled = control.dataset.offered === "no";
      control.addEventListener("input", show);
      control.addEventListener("change", show);
    }
    show();
  }
  function start() { document.querySelectorAll(".web-dashboard").forEach(wire); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
