"""Lesson 0's exercise: the seed's loop with its one decision left out, when to step (the cycle is complete).

The learner replaces `...` in `if ...:`; the check is lesson 3's (`TheLoop`: the same fingerprint of every step's
gradient, the same confirmation by training against `accumlib.train`) on a problem of its own, with the seed's
accum_steps of 4: 16 micro-batches of 2 digits, 4 full cycles. The lesson's question names that 4, so a loop that
passes is run again with accum_steps = 3 (LoopExercise's second problem): a condition with the number 4 written in
(`(step + 1) % 4 == 0`) steps at the wrong micro-batches there, and is told so ("not-general").
"""
from .fingerprint import Problem
from .loops import TheLoop


class FirstLoop(TheLoop):
    lesson, name = 0, "first_loop"
    problem = Problem(samples=32, micro_batch_size=2, accum_steps=4)  # 16 micro-batches, 4 full cycles
    # the second problem of LoopExercise.judge: another accum_steps, so that a condition with the 4 written in fails
    other_problem = Problem(samples=30, micro_batch_size=2, accum_steps=3)  # 15 micro-batches, 5 full cycles
    stub = '''\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if ...:
            optimizer.step()
            optimizer.zero_grad()


exercises.first_loop.check(accumulate)
'''
    solution_code = '''\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:  # the cycle is complete
            optimizer.step()
            optimizer.zero_grad()


exercises.first_loop.check(accumulate)
'''


first_loop = FirstLoop()
