// Reads a Chrome trace the way its viewers do and prints what they found, as JSON, for
// chrome_trace.rs to check: `node read_trace.mjs CONSUMER_DIR TRACE`, where CONSUMER_DIR is
// where .ci/trace-consumer.sh installed the readers.
//
//   devtools.slices        track name -> names of its slices, per Chrome DevTools' trace engine
//   tracerbench.process    the process's name, per TracerBench's trace model
//   tracerbench.slices     track name -> names of its slices
//   tracerbench.instants   track name -> names of its instant events
//   tracerbench.counters   counter name -> [[µs, bytes], ...]
import fs from 'node:fs';
import path from 'node:path';
import {createRequire} from 'node:module';
import {pathToFileURL} from 'node:url';

const [dir, file] = process.argv.slice(2);
const modules = path.join(dir, 'node_modules');
const events = JSON.parse(fs.readFileSync(file, 'utf8')).traceEvents;

// The DevTools engine measures layout with DOMRect, which Node lacks; nothing here lays out.
globalThis.DOMRect ??= class DOMRect {};
const Trace = await import(
    pathToFileURL(path.join(modules, '@paulirish/trace_engine/models/trace/trace.js')).href);
const engine = Trace.TraceModel.Model.createWithAllHandlers();
await engine.parse(events);
const devtools = {slices: {}};
for (const [, process] of engine.parsedTrace().data.Renderer.processes) {
  for (const [, thread] of process.threads) {
    devtools.slices[thread.name] = thread.entries.filter(e => e.ph === 'X').map(e => e.name);
  }
}

const {buildModel} = createRequire(path.join(modules, '/'))('@tracerbench/trace-model');
const model = buildModel(events);
const tracerbench = {process: null, slices: {}, instants: {}, counters: {}};
for (const process of model.processes) {
  tracerbench.process = process.name;
  for (const thread of process.threads) {
    tracerbench.slices[thread.name] = thread.events.filter(e => e.isComplete()).map(e => e.name);
    tracerbench.instants[thread.name] = thread.events.filter(e => e.isInstant()).map(e => e.name);
  }
  for (const event of process.events.filter(e => e.isCounter())) {
    (tracerbench.counters[event.name] ??= []).push([event.start, event.getNumberArg('bytes')]);
  }
}
console.log(JSON.stringify({devtools, tracerbench}));
