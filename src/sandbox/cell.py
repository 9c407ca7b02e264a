# How a tool call's code runs once it is in its process: rStar2-Agent's notebook-cell semantics
# (or plain script semantics), its one-line error text and the call's exit status. One copy for
# both places that run code: the sandbox's executor (src/sandbox/zygote.py; src/sandbox/executor.ts
# prepends this file to it, so both run as one `python -c` program) and the warm runner of trusted
# code (src/sandbox/warm.py, which imports it), so a demonstration's tool output is the text the
# sandbox gives the same program.
import ast
import atexit
import os
import sys
import traceback

CELL_GLOBALS = globals()


class CodeError(Exception):
    """rStar2-Agent's tool template error text: `Type at line N: message\n  <line>`. The line is the
    innermost frame of the call's own code (an error raised inside sympy names the user's line
    that called it); a syntax error has no such frame and names its own line."""

    def __init__(self, error, code):
        lineno = None
        tb = error.__traceback__
        while tb is not None:
            # The executor runs as `python -c` too, so its own frames are told apart by their globals.
            frame = tb.tb_frame
            if frame.f_code.co_filename == '<string>' and frame.f_globals is not CELL_GLOBALS:
                lineno = tb.tb_lineno
            tb = tb.tb_next
        if lineno is None and isinstance(error, SyntaxError):
            lineno = error.lineno
        kind, message = type(error).__name__, str(error)
        lines = code.splitlines()
        if lineno is not None and 0 <= lineno - 1 < len(lines):
            super().__init__(f'{kind} at line {lineno}: {message}\n  {lines[lineno - 1]}')
        else:
            super().__init__(f'{kind}: {message}')


def run_notebook(code, scope):
    """A notebook cell: when the last statement is an expression its value is printed with repr
    (`x = 5; x` prints 5, as Jupyter does), evaluated once; errors are one line on stderr in the
    release template's format, and the exit status is 1. The split is made on the parsed tree,
    so every line number is the code's own."""
    try:
        tree = ast.parse(code, '<string>')
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if tree.body:
            exec(compile(tree, '<string>', 'exec'), scope)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), '<string>', 'eval'), scope)
            if value is not None:
                print(repr(value))
    except Exception as error:
        print(str(CodeError(error, code)), file=sys.stderr)
        return 1
    return 0


def run_script(code, scope):
    """Plain `python script.py` semantics: uncaught errors print a traceback, exit 1."""
    try:
        exec(compile(code, '<string>', 'exec'), scope)
    except Exception as error:
        tb = error.__traceback__.tb_next if error.__traceback__ else None
        traceback.print_exception(type(error), error, tb)
        return 1
    return 0


def run_cell(code, mode, scope, exit_funcs=True):
    """Runs `code` in `scope` ('script' mode or the notebook default) and then the atexit
    functions, as the end of a process would (not for a session's cell: its process lives on as the
    session, as a Jupyter kernel runs them only when it shuts down); returns the exit status a process would have
    (`sys.exit(n)`: n & 0xFF; `sys.exit('text')`: the text on stderr, 1)."""
    try:
        if mode == 'script':
            status = run_script(code, scope)
        else:
            status = run_notebook(code, scope)
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            print(code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        status = 130
    if exit_funcs:
        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass
    return status


def dead_children():
    """The pids of this process's children that have exited, collected without waiting: both places
    that run code keep forked sessions whose ends they must reap."""
    pids = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return pids
        if pid == 0:
            return pids
        pids.append(pid)
