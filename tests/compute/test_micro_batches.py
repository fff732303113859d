"""Token-budget micro-batches: groups worked out by hand."""
import pytest

from peer_rl.compute.micro_batches import by_count, by_token_budget, by_units, unit_cost


def test_longest_first_groups_stay_within_the_budget():
    # longest first: rows 2 (8), 4 (7), 0 (5), 1 (3), 3 (2); [2, 4] costs 2 x 8 = 16, adding
    # row 0 would cost 24; [0, 1, 3] costs 3 x 5 = 15
    assert by_token_budget([5, 3, 8, 2, 7], budget=16) == [[2, 4], [0, 1, 3]]


def test_asked_for_more_groups_the_costliest_is_halved():
    assert by_token_budget([5, 3, 8, 2, 7], budget=16, n_groups=3) == [[2], [4], [0, 1, 3]]
    assert by_token_budget([5, 3, 8, 2, 7], budget=16, n_groups=4) == [[2], [4], [0], [1, 3]]


def test_a_row_longer_than_the_budget_goes_alone():
    assert by_token_budget([20, 3, 3], budget=10) == [[0], [1, 2]]


def test_impossible_group_counts_are_refused():
    with pytest.raises(ValueError, match="n_groups=1: expected between 2 and 5"):
        by_token_budget([5, 3, 8, 2, 7], budget=16, n_groups=1)
    with pytest.raises(ValueError, match="n_groups=6"):
        by_token_budget([5, 3, 8, 2, 7], budget=16, n_groups=6)


def test_every_row_exactly_once():
    lengths = [(7 * i) % 13 + 1 for i in range(40)]
    groups = by_token_budget(lengths, budget=30, n_groups=25)
    assert sorted(i for g in groups for i in g) == list(range(40)) and len(groups) == 25


def test_by_count():
    assert by_count(5, 2) == [[0, 1], [2, 3], [4]]


def test_packed_groups_count_only_the_rows_own_tokens():
    # packed rows (no padding): [2, 4] holds 8 + 7 = 15 tokens, adding row 0 would make 20;
    # [0, 1, 3] holds 5 + 3 + 2 = 10. Padded, [0, 1, 3, ...] would cost rows x 5 instead
    assert by_token_budget([5, 3, 8, 2, 7], budget=16, padded=False) == [[2, 4], [0, 1, 3]]
    # 3 x 5 = 15 padded tokens do not fit 12, but 5 + 4 + 3 = 12 real ones do
    assert by_token_budget([5, 4, 3], budget=12) == [[0, 1], [2]]
    assert by_token_budget([5, 4, 3], budget=12, padded=False) == [[0, 1, 2]]
    # halving picks the group with the most real tokens: [0, 1, 2] (12) before [3] (2)
    assert by_token_budget([5, 4, 3, 2], budget=12, n_groups=3, padded=False) == \
        [[0], [1, 2], [3]]


def test_units_stay_together_and_their_prompt_counts_once():
    """Rows 0-2 one prompt of 6 tokens (rows of 8, 9, 7), rows 3-4 another of 4 (rows of 5, 6),
    row 5 alone (10). Unit costs: 6 + 2 + 3 + 1 = 12, 4 + 1 + 2 = 7, 10. Budget 13: the first
    unit (12), then row 5 (10) alone, then the second unit (7)."""
    lengths, unit, prefix = [8, 9, 7, 5, 6, 10], [0, 0, 0, 1, 1, 2], [6, 6, 6, 4, 4, 0]
    assert by_units(lengths, unit, prefix, 13) == [[0, 1, 2], [5], [3, 4]]
    # budget 19, costliest first: unit 0 (12), then row 5 (22 > 19: a new forward), then
    # unit 1 beside it (10 + 7 = 17)
    assert by_units(lengths, unit, prefix, 19) == [[0, 1, 2], [5, 3, 4]]
    # a unit larger than the budget is cut, each piece paying its prompt: 8, +3, then 7 alone
    assert by_units(lengths, unit, prefix, 11) == [[0, 1], [2], [5], [3, 4]]
    # n_groups: the costliest group with more than one row is halved
    assert by_units(lengths, unit, prefix, 13, n_groups=4) == [[0], [1, 2], [5], [3, 4]]
    assert unit_cost([0, 1, 2, 3, 4], lengths, unit, prefix) == 19
