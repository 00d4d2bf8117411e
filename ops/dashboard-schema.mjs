// Types every Grafana dashboard in dashboards/ as the `Dashboard` of Grafana's
// own published schema (npm @grafana/schema) and lets TypeScript judge it:
// a missing required field, a wrong type or an unknown key is an error.
//
//   node ops/dashboard-schema.mjs TOOLS_DIR
//
// TOOLS_DIR holds node_modules with @grafana/schema and typescript (.ci/run
// installs them there). Each dashboard becomes TOOLS_DIR/check/<name>.ts,
// `const dashboard: Json<Dashboard> = <the JSON>`, so literal values are
// checked against the schema's unions and object literals get excess-property
// checks. Json<T> only reads each TypeScript string enum as the union of its
// values: the JSON holds "palette-classic", the type names
// FieldColorModeId.PaletteClassic, and the two are the same schema value.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const tools = resolve(process.argv[2] ?? '');
const dashboards = join(dirname(fileURLToPath(import.meta.url)), '..', 'dashboards');
const out = join(tools, 'check');
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const files = readdirSync(dashboards).filter((f) => f.endsWith('.json')).sort();
if (files.length === 0) {
  console.error(`no dashboards in ${dashboards}`);
  process.exit(1);
}
for (const file of files) {
  const json = JSON.parse(readFileSync(join(dashboards, file), 'utf8'));
  const source =
    `// Generated from dashboards/${file}: the JSON as Grafana's Dashboard type.\n` +
    `import type { Dashboard } from '@grafana/schema';\n` +
    `type Json<T> = T extends string ? \`\${T}\` : T extends (infer U)[] ? Json<U>[] : T extends object ? { [K in keyof T]: Json<T[K]> } : T;\n` +
    `export const dashboard: Json<Dashboard> = ${JSON.stringify(json, null, 2)};\n`;
  writeFileSync(join(out, file.replace(/\.json$/, '.ts')), source);
}
writeFileSync(
  join(out, 'tsconfig.json'),
  JSON.stringify({
    compilerOptions: {
      strict: true,
      noEmit: true,
      target: 'es2022',
      module: 'esnext',
      moduleResolution: 'bundler',
      skipLibCheck: true,
    },
    include: ['*.ts'],
  }),
);
try {
  execFileSync(join(tools, 'node_modules', '.bin', 'tsc'), ['-p', out, '--pretty', 'false'], {
    stdio: 'inherit',
  });
} catch {
  console.error(`\ndashboards do not match @grafana/schema's Dashboard type (sources in ${out})`);
  process.exit(1);
}
const version = JSON.parse(readFileSync(join(tools, 'node_modules/@grafana/schema/package.json'), 'utf8')).version;
console.log(`grafana-schema: ${files.length} dashboards match @grafana/schema ${version}`);
