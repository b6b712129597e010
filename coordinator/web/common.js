// Shared by the dashboard pages: fetching the coordinator's JSON API and formatting.
"use strict";

async function getJson(path) {
  const response = await fetch(path, {credentials: "same-origin"});
  if (response.status === 401) { window.location = "/login"; throw new Error("login needed"); }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

function age(unixMs) {
  if (!unixMs) return "";
  const seconds = Math.max(0, (Date.now() - Number(unixMs)) / 1000);
  if (seconds < 90) return `${seconds.toFixed(0)} s`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

function stateCell(state) { return el("td", {class: `state ${state}`}, state || ""); }

function progressCell(step, steps) {
  const fraction = steps > 0 ? Math.min(1, step / steps) : 0;
  const bar = el("span", {class: "bar"}, el("span", {style: `width: ${(fraction * 100).toFixed(1)}%`}));
  return el("td", {}, bar, ` ${step || 0} / ${steps || 0}`);
}

function showError(error) {
  const box = document.getElementById("error");
  if (box) box.textContent = error ? String(error.message || error) : "";
}
