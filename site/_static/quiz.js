/* The lessons' quiz on the website, answered in the page (no kernel, no server). tools/site.py puts each stored
   quiz's questions, as accumlib's quiz loads and grades them (tools/site_data.py), into a JSON script in the page;
   this draws them: per-option feedback, the hint from the first wrong answer on, the stored result of a "predict,
   then run it" question once answered, and the score. The first answer to each question is kept in the browser
   (localStorage), so the first-try score survives a reload; without localStorage the page still works. */
(function () {
  "use strict";
  const PREFIX = "accumlib-quiz:v1:";
  function load(key) {
    try { return JSON.parse(window.localStorage.getItem(PREFIX + key)); } catch (e) { return null; }
  }
  function save(key, value) {
    try { window.localStorage.setItem(PREFIX + key, JSON.stringify(value)); } catch (e) { /* private mode */ }
  }
  function format(template, values) {
    return template.replace(/\{(\w+)\}/g, (all, name) => (name in values ? String(values[name]) : all));
  }
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    for (const child of children || []) node.appendChild(child);
    return node;
  }

  function draw(box, index) {
    const data = JSON.parse(box.querySelector("script.web-quiz-data").textContent);
    const ui = data.ui, lang = data.language;
    const key = (id) => lang + ":" + id;
    const score = el("p", {class: "wq-score", "aria-live": "polite"});
    function update() {
      let first = 0, correct = 0;
      for (const q of data.questions) {
        const record = load(key(q.id));
        if (record && record.first) first += 1;
        if (record && record.solved) correct += 1;
      }
      score.textContent = format(ui.score, {first, correct, total: data.questions.length});
    }
    const parts = [el("h3", {text: data.title})];
    data.questions.forEach((q, number) => {
      const name = `wq-${index}-${number}`;
      const feedback = el("div", {class: "wq-feedback", "aria-live": "polite"});
      const hint = el("p", {class: "wq-hint", hidden: ""});
      const result = el("div", {class: "wq-result", hidden: ""});
      const fieldset = el("fieldset", {class: "wq-question", "data-qid": q.id}, [
        el("legend", {text: `${number + 1}. ${q.prompt}`})]);
      let read;
      if (q.kind === "number") {
        const input = el("input", {type: "text", inputmode: "decimal", placeholder: ui.number_placeholder,
                                   "aria-label": ui.your_answer});
        fieldset.appendChild(el("label", {class: "wq-number"}, [el("span", {text: ui.your_answer + " "}), input]));
        read = () => {
          const value = Number(input.value.trim().replace(/,/g, ""));
          if (input.value.trim() === "" || !Number.isFinite(value)) return {message: ui.not_a_number};
          const known = q.known.find(([answer]) => answer === value);
          if (value === q.answer) return {right: true, feedback: q.right};
          return {right: false, feedback: known ? known[1] : q.otherwise};
        };
      } else {
        q.options.forEach((option, i) => {
          fieldset.appendChild(el("label", {class: "wq-option"}, [
            el("input", {type: "radio", name, value: String(i)}), el("span", {text: option.text})]));
        });
        read = () => {
          const chosen = fieldset.querySelector("input:checked");
          if (!chosen) return {message: ui.choose_first};
          const option = q.options[Number(chosen.value)];
          return {right: option.right, feedback: option.feedback};
        };
      }
      const check = el("button", {type: "button", class: "wq-check", text: ui.check});
      check.addEventListener("click", () => {
        const answer = read();
        feedback.replaceChildren();
        if (answer.message) { feedback.appendChild(el("p", {text: answer.message})); return; }
        const record = load(key(q.id)) || {first: answer.right, solved: false, wrong: false};
        record.solved = record.solved || answer.right;
        record.wrong = record.wrong || !answer.right;
        save(key(q.id), record);
        feedback.className = "wq-feedback " + (answer.right ? "wq-right" : "wq-wrong");
        feedback.appendChild(el("p", {}, [el("b", {text: (answer.right ? ui.correct : ui.wrong) + " "}),
                                          document.createTextNode(answer.feedback)]));
        if (record.wrong && !answer.right) {
          hint.replaceChildren(el("i", {text: ui.hint + ": "}), document.createTextNode(q.hint));
          hint.hidden = false;
        }
        if (q.result) {
          result.replaceChildren(el("p", {text: data.measured}), el("pre", {text: q.result}));
          result.hidden = false;
        }
        update();
      });
      fieldset.append(check, feedback, hint, result);
      if (load(key(q.id))) fieldset.appendChild(el("p", {class: "wq-before", text: data.before}));
      parts.push(fieldset);
    });
    parts.push(score);
    box.querySelector(".web-quiz-body").replaceChildren(...parts);
    update();
  }

  function start() { document.querySelectorAll(".web-quiz").forEach(draw); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
