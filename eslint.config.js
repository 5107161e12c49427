// Lint for the whole workspace (`pnpm lint` = `eslint .`).
//
// Syntactic rules (eslint and typescript-eslint recommended) everywhere. The few rules
// that need type information, and catch the bugs this project cares most about (a
// promise nobody awaits, a promise where a callback's result is ignored), run on every
// package's `src/` and `test/`, which each package's tsconfig.json includes; the project
// service finds that tsconfig by itself.
import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

const typeAwareFiles = ['{packages,plugins,examples}/*/{src,test}/**/*.ts', 'conformance/{src,test}/**/*.ts'];
const testFiles = ['**/test/**/*.ts', '**/bench/**/*.ts', '**/*.test.ts'];

export default tseslint.config(
  {
    ignores: ['**/dist/**', '**/node_modules/**', '.tools/**', '**/coverage/**', '.kafka/**', 'bench/results/**', '**/.prisma-client/**'],
  },
  {
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    languageOptions: {
      ecmaVersion: 2023,
      sourceType: 'module',
      globals: { ...globals.node },
    },
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
      '@typescript-eslint/no-explicit-any': 'error',
      // Literal unions and `as const` instead (STYLE.md).
      'no-restricted-syntax': ['error', { selector: 'TSEnumDeclaration', message: 'use a literal union or an `as const` object instead of enum' }],
    },
  },
  {
    files: typeAwareFiles,
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/await-thenable': 'error',
    },
  },
  {
    // The operator console's front end runs in the browser (built by Vite into @courier/cli's dist/console).
    files: ['packages/cli/console/src/**/*.ts'],
    languageOptions: { globals: { ...globals.browser } },
  },
  {
    // Tests may use `any`, and sparse arrays, to feed hostile input to the code under test.
    files: testFiles,
    rules: {
      '@typescript-eslint/no-explicit-any': 'off',
      'no-sparse-arrays': 'off',
    },
  },
);
